# Sourced by the CLI tests (tests/cli/*.sh; ctest sets TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON):
# the environment of scripts/env.sh (mpirun as root, oversubscribed), a fresh work directory $W,
# the Python interpreter $PY, and the checks' counters: ok NAME, bad NAME, then finish (the summary
# line; its status is the test's).
source "$TPTRAIN_SRC/scripts/env.sh"
W=$TPTRAIN_WORK; rm -rf "$W"; mkdir -p "$W"
PY=${PYTHON:-/usr/bin/python3}
pass=0; fail=0
ok() { echo "ok   $1"; pass=$((pass+1)); }
bad() { echo "FAIL $1"; fail=$((fail+1)); }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; }
