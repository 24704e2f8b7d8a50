#!/usr/bin/env bash
# The process is named tptrain (top, ps, /proc/PID/comm) after tptrain re-executes itself for the CPU
# libraries' environment (core/cpu/blas_select.h): it re-executes its real path, not /proc/self/exe
# (which would name it "exe"), also when started through a symlink (scripts/setup.sh's bin folder).
# Started without an MPI launcher it starts no MPI; TPTRAIN_MPI_INIT=1 makes it start MPI.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
mkdir -p "$W/bin"; ln -s "$TPTRAIN" "$W/bin/tptrain"
mkfifo "$W/config"
# --config - blocks reading standard input (the FIFO) after the re-exec: time to look at the process
env -u OMP_WAIT_POLICY -u TPTRAIN_NO_REEXEC -u TPTRAIN_REEXECUTED PATH="$W/bin:$PATH" \
  tptrain --config - < "$W/config" > "$W/out.log" 2>&1 &
pid=$!
exec 3> "$W/config"  # the writer end, so that the reader's open returns
for _ in $(seq 100); do
  tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -q '^TPTRAIN_REEXECUTED=1$' && break
  sleep 0.1
done
if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -q '^TPTRAIN_REEXECUTED=1$'; then
  ok "tptrain re-executed itself (OMP_WAIT_POLICY unset)"
else bad "no re-exec seen in /proc/$pid/environ"; fi
comm=$(cat "/proc/$pid/comm" 2>/dev/null)
[ "$comm" = tptrain ] && ok "process name after the re-exec: $comm" || bad "process name '$comm', want tptrain"
# started without a launcher: one rank without MPI, so no Open MPI singleton daemon (parallel/grid.cpp)
kids=$(ps --ppid "$pid" -o comm= 2>/dev/null | tr '\n' ' ')
[ -z "$kids" ] && ok "no MPI started without a launcher (no child process)" || bad "child processes without a launcher: $kids"
exec 3>&-  # end of the config: an empty document, exit 2
wait "$pid"; rc=$?
[ "$rc" = 2 ] && ok "an empty config from standard input exits 2" || { bad "exit $rc"; cat "$W/out.log"; }

# TPTRAIN_MPI_INIT=1 (a launcher tptrain does not know): MPI starts, here Open MPI's singleton with its daemon
if command -v ompi_info >/dev/null 2>&1 && "$TPTRAIN" --version | grep -q "communication: MPI"; then
  rm -f "$W/config"; mkfifo "$W/config"
  TPTRAIN_MPI_INIT=1 "$TPTRAIN" --config - < "$W/config" > "$W/out2.log" 2>&1 &
  pid=$!
  exec 3> "$W/config"
  kids=""
  for _ in $(seq 100); do
    kids=$(ps --ppid "$pid" -o comm= 2>/dev/null | tr '\n' ' ')
    [ -n "$kids" ] && break
    sleep 0.1
  done
  [[ $kids == *orted* || $kids == *prte* ]] && ok "TPTRAIN_MPI_INIT=1 starts MPI (child: $kids)" ||
    bad "TPTRAIN_MPI_INIT=1: no Open MPI daemon among the children ('$kids')"
  exec 3>&-
  wait "$pid"; rc=$?
  [ "$rc" = 2 ] && ok "with MPI started, an empty config exits 2" || { bad "exit $rc"; cat "$W/out2.log"; }
fi
finish
