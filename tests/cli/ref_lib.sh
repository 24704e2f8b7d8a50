# Sourced by the tests that run the PyTorch reference many times (parity_lib.sh, fp8_lib.sh):
# ref_py LOG SCRIPT ARGS... runs `$PY SCRIPT ARGS > LOG 2>&1` (killed after REF_TIMEOUT seconds, default
# 300: exit 124) in the current directory, in a child forked from tests/reference/forkserver.py, a
# Python that imported torch once for the whole test: `import torch` is 2-3 s of CPU on 2 cores, most
# of a small reference run. Its return is the script's exit status. REF_FORKSERVER=0 runs each in a
# Python of its own.
ref_py() {
  local log=$1
  shift
  if [ "${REF_FORKSERVER:-1}" != 0 ] && [ -z "${REF_SERVER_W:-}" ]; then ref_server_start; fi
  if [ -n "${REF_SERVER_W:-}" ]; then
    local req rc
    req=$(mktemp "$REF_SERVER_DIR/request.XXXXXX")
    printf '%s\n' "$PWD" "$log" "${REF_TIMEOUT:-300}" "$@" > "$req"
    echo "$req" >&"$REF_SERVER_W"
    # the server kills the run after its timeout; waits of 5 s at a time, checking that it lives
    while :; do
      if read -r -t 5 rc <&"$REF_SERVER_R"; then rm -f "$req"; return "$rc"; fi
      kill -0 "$REF_SERVER_PID" 2>/dev/null || break
    done
    echo "ref_py: the fork server ended (its log: $REF_SERVER_DIR/server.log):" >> "$log"
    tail -n 20 "$REF_SERVER_DIR/server.log" >> "$log" 2>/dev/null
    return 1
  fi
  timeout "${REF_TIMEOUT:-300}" "$PY" "$@" > "$log" 2>&1
}

# The server: two FIFOs in a folder of its own; it ends when this shell closes them (at its exit).
# This shell opens both read-write, which never blocks: a server that dies before it opens them
# (no python3, no torch) must not hang the test; ref_py then sees it gone.
ref_server_start() {
  REF_SERVER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tptrain_ref.XXXXXX")
  mkfifo "$REF_SERVER_DIR/requests" "$REF_SERVER_DIR/responses"
  "$PY" "$(cd "$(dirname "${BASH_SOURCE[0]}")/../reference" && pwd)/forkserver.py" \
    "$REF_SERVER_DIR/requests" "$REF_SERVER_DIR/responses" > "$REF_SERVER_DIR/server.log" 2>&1 &
  REF_SERVER_PID=$!
  exec {REF_SERVER_W}<> "$REF_SERVER_DIR/requests"
  exec {REF_SERVER_R}<> "$REF_SERVER_DIR/responses"
  trap 'ref_server_stop' EXIT
}

ref_server_stop() {
  [ -n "${REF_SERVER_W:-}" ] || return 0
  exec {REF_SERVER_W}>&- {REF_SERVER_R}<&-
  wait "$REF_SERVER_PID" 2>/dev/null
  rm -rf "$REF_SERVER_DIR"
  REF_SERVER_W=""
}
