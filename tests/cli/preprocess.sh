#!/usr/bin/env bash
# `tptrain preprocess`: plain text (blank-line and fortune "%" documents) and JSON lines ->
# Megatron .bin/.idx, checked by tests/tools/make_data.py, which parses the files and reads the
# inputs on its own.
# Environment (set by ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -u
: "${TPTRAIN:?}" "${TPTRAIN_SRC:?}" "${TPTRAIN_WORK:?}"
PYTHON=${PYTHON:-/usr/bin/python3}
TOOL="$TPTRAIN_SRC/tests/tools/make_data.py"
source "$TPTRAIN_SRC/tests/cli/lib.sh"
mkdir -p "$W/out" && cd "$W" || exit 1


# run NAME CMD...: expects exit 0; keeps stdout+stderr in NAME.log
run() {
  local name=$1
  shift
  if "$@" >"$name.log" 2>&1; then ok "$name"; else bad "$name (exit $?)"; sed 's/^/    /' "$name.log"; fi
}
# verify NAME PREFIX CHECK-ARGS...: the independent parser agrees with the inputs
verify() {
  local name=$1
  shift
  if "$PYTHON" "$TOOL" check "$@" >"$name.check.log" 2>&1; then
    ok "$name: $(tail -1 "$name.check.log")"
  else
    bad "$name"
    sed 's/^/    /' "$name.check.log"
  fi
}
# contains NAME FILE TEXT
contains() { if grep -qF -- "$3" "$2"; then ok "$1"; else bad "$1: '$3' not in $2"; sed 's/^/    /' "$2"; fi; }

# ---- inputs ----
printf 'The first document,\nover two lines. caf\xc3\xa9 \xe2\x82\xac\n\n\n  \t\nSecond document.\n\nThird\tone\r\nends here\n' >plain.txt
printf 'Fortune one.\n\nStill fortune one.\n%%\nFortune two: 100%% sure\n%%\n%%\n\n%%\nlast, without newline' >fortune.txt
cat >docs.jsonl <<'EOF'
{"text": "Hello JSON \u00e9\u20ac \ud83d\ude00\nsecond line", "id": 1}

{"text": "", "id": 2}
{"id": 3, "text": "tabs\tand \"quotes\" and \\ backslash"}
{"text": "x", "body": "a body"}
EOF
printf '{"body": "b1"}\n{"body": "b2 \\u00fc"}\n' >bodies.json

# ---- plain text, blank-line documents, with EOD ----
run plain_text "$TPTRAIN" preprocess --input plain.txt --output-prefix out/plain --append-eod
verify plain_text_contents out/plain --inputs plain.txt --append-eod
contains plain_text_summary plain_text.log "3 documents"

# ---- fortune format, no EOD ----
run fortune "$TPTRAIN" preprocess --input fortune.txt --output-prefix out/fortune
verify fortune_contents out/fortune --inputs fortune.txt

# ---- JSON lines ----
run jsonl "$TPTRAIN" preprocess --input docs.jsonl --output-prefix out/jsonl --append-eod --workers 4
verify jsonl_contents out/jsonl --inputs docs.jsonl --append-eod
contains jsonl_summary jsonl.log "3 documents"

# ---- --json-key, several inputs in order (JSON then text), --input given twice ----
run multi "$TPTRAIN" preprocess --input bodies.json fortune.txt --input plain.txt --json-key body \
  --output-prefix out/multi --append-eod
verify multi_contents out/multi --inputs bodies.json fortune.txt plain.txt --json-key body --append-eod

# ---- empty input: a valid dataset with no documents ----
: >empty.txt
run empty "$TPTRAIN" preprocess --input empty.txt --output-prefix out/empty
verify empty_contents out/empty --inputs empty.txt

# ---- re-running replaces the outputs; no temporary files are left behind ----
run rerun "$TPTRAIN" preprocess --input fortune.txt --output-prefix out/plain
verify rerun_contents out/plain --inputs fortune.txt
leftovers=$(find out -name '*.tmp*' | wc -l)
if [[ "$leftovers" == 0 ]]; then ok "no temporary files"; else bad "temporary files left: $(find out -name '*.tmp*')"; fi

# ---- the summary names both outputs and the token count ----
contains summary_names_outputs plain_text.log "out/plain.bin"
tokens=$("$PYTHON" -c "import os; print(os.path.getsize('out/jsonl.bin') // 2)")
contains summary_tokens jsonl.log "$tokens tokens"

# ---- --help ----
run help "$TPTRAIN" preprocess --help
contains help_text help.log "--output-prefix"

finish
