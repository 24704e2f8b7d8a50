#!/usr/bin/env bash
# The process is named tptrain (top, ps, /proc/PID/comm) after tptrain re-executes itself for the CPU
# libraries' environment (core/cpu/blas_select.h): it re-executes its real path, not /proc/self/exe
# (which would name it "exe"), also when started through a symlink (scripts/setup.sh's bin folder).
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
exec 3>&-  # end of the config: an empty document, exit 2
wait "$pid"; rc=$?
[ "$rc" = 2 ] && ok "an empty config from standard input exits 2" || { bad "exit $rc"; cat "$W/out.log"; }
finish
