# Sourced by the CLI tests (tests/cli/*.sh; ctest sets TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON):
# the environment of scripts/env.sh (mpirun as root, oversubscribed), a fresh work directory $W,
# the Python interpreter $PY, and the checks' counters: ok NAME, bad NAME, then finish (the summary
# line; its status is the test's); expect_exit2, same_dataset, fortune_files and fetch_reference, which several tests share.
source "$TPTRAIN_SRC/scripts/env.sh"
W=$TPTRAIN_WORK; rm -rf "$W"; mkdir -p "$W"
# the test's own OpenMPI session directory (mpirun's and a lone tptrain's): tests side by side (ctest -j2)
# otherwise share /tmp/ompi.<host>.<uid>, which one job's clean-up can remove while another creates its
# own there (OpenMPI 4.1: "orte_session_dir failed ... No such file or directory"; cli_layouts, once in
# CI, 2026-12-06)
export OMPI_MCA_orte_tmpdir_base=/tmp/tpt-ompi-$(basename "$W")
rm -rf "$OMPI_MCA_orte_tmpdir_base"
PY=${PYTHON:-/usr/bin/python3}
pass=0; fail=0
ok() { echo "ok   $1"; pass=$((pass+1)); }
bad() { echo "FAIL $1"; fail=$((fail+1)); }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; }
# expect_exit2 NAME TEXT CMD...: CMD exits 2 with TEXT in its output (kept in $W/NAME.log)
expect_exit2() {
  local name=$1 text=$2
  shift 2
  "$@" > "$W/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$text" "$W/$name.log"; then ok "$name: exit 2: $(grep -F -- "$text" "$W/$name.log" | head -1 | cut -c1-200)"
  else bad "$name (exit $rc, expected 2 and '$text')"; sed 's/^/    /' "$W/$name.log" | head -5; fi
}
same_dataset() {  # NAME PREFIX1 PREFIX2: the same .bin and .idx
  if cmp -s "$2.bin" "$3.bin" && cmp -s "$2.idx" "$3.idx"; then ok "$1"; else bad "$1: $2 and $3 differ"; fi
}
fortune_files() {  # FORTUNES: the text files of Debian's fortunes-min and fortunes packages
  FORTUNES=()
  local f
  for f in /usr/share/games/fortunes/*; do
    case "$f" in *.dat|*.u8|*-o) continue;; esac
    [ -f "$f" ] && FORTUNES+=("$f")
  done
}
# fetch_reference WHAT CACHE: the reference's files fetched from PyPI into CACHE ($REF fetch, once;
# then PYTHONPATH has CACHE/py); where PyPI cannot be reached (exit 77) the test ends here with
# "SKIPPED: WHAT" and the reason, and any other failure ends it failed
fetch_reference() {
  $PY "$REF" fetch "$2" > "$W/fetch.log" 2>&1
  local rc=$?
  if [ $rc -eq 77 ]; then echo "SKIPPED: $1: $(tail -1 "$W/fetch.log")"; finish; exit; fi
  if [ $rc -ne 0 ]; then bad "fetching the reference of $1: $(tail -3 "$W/fetch.log")"; finish; exit; fi
  ok "$(tail -1 "$W/fetch.log")"
  export PYTHONPATH=$2/py${PYTHONPATH:+:$PYTHONPATH}
}
