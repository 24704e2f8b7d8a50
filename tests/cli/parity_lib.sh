# Sourced by the parity tests (tests/cli/parity_torch.sh, parity_llama.sh, parity_moe.sh) after
# they set NAME (the test's name): the environment (TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON,
# PARITY_* as those files say; PARITY_AUX_ABS (1e-5): the MoE balancing losses' tolerance), the work
# directory as the current one, the counters pass / fail / show, parity_case (one case: the
# reference and tptrain on cfg.yaml, metrics compared) and parity_finish (the summary).
# PARITY_ONLY (optional, by hand): a bash regex; only the cases and self-tests whose name matches run.
SRC=${TPTRAIN_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
PY=${PYTHON:-/usr/bin/python3}
WORK=${TPTRAIN_WORK:-$(mktemp -d "/tmp/$NAME.XXXXXX")}
TPTRAIN=${TPTRAIN:-}
REF=$SRC/tests/reference
TOL=(--loss-abs "${PARITY_LOSS_ABS:-1e-4}" --gradnorm-rel "${PARITY_GRADNORM_REL:-1e-3}"
     --lr-rel "${PARITY_LR_REL:-1e-6}" --aux-abs "${PARITY_AUX_ABS:-1e-5}" --min-iters 8)
# bf16 MoE runs: a token whose top-k flips in bf16 moves the balancing loss and the imbalance (a step
# of 1 / the micro-batch's assignments), hence PARITY_BF16_AUX_ABS (5e-2)
TOL_BF16=(--loss-abs "${PARITY_BF16_LOSS_ABS:-2e-2}" --gradnorm-rel "${PARITY_BF16_GRADNORM_REL:-5e-2}"
          --lr-rel "${PARITY_LR_REL:-1e-6}" --aux-abs "${PARITY_BF16_AUX_ABS:-5e-2}" --min-iters 8)
TIMEOUT=${PARITY_TIMEOUT_S:-300}
export PYTHONDONTWRITEBYTECODE=1

mkdir -p "$WORK" || { echo "cannot create TPTRAIN_WORK=$WORK"; exit 1; }
cd "$WORK" || exit 1
echo "$NAME: tptrain=${TPTRAIN:-<unset>} src=$SRC work=$WORK python=$PY"
source "$SRC/scripts/env.sh"  # mpirun as root, oversubscribed
source "$SRC/tests/cli/ref_lib.sh"  # ref_py: the reference runs forked from one Python

passed=0
failed=0
failures=()
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); failures+=("$1"); }
show() { echo "---- $1 (last 40 lines)"; tail -n 40 "$1" | sed 's/^/    /'; echo "----"; }

# same_bits NAME A B: cases A and B logged bitwise the same metrics (lm loss, grad norm and the MoE
# balancing losses where logged): a recompute mode changes what is kept, not one bit of the run
same_bits() {
  if [ -s "$2.tptrain.jsonl" ] && [ -s "$3.tptrain.jsonl" ]; then
    if "$PY" - "$2.tptrain.jsonl" "$3.tptrain.jsonl" <<'PYEOF'
import json, sys
a, b = ([json.loads(l) for l in open(p) if "lm_loss" in l] for p in sys.argv[1:3])
keys = ("lm_loss", "grad_norm", "load_balancing_loss", "z_loss", "moe_max_imbalance")
sys.exit(0 if len(a) == len(b) > 0 and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in keys) else 1)
PYEOF
    then pass "$1 ($2 = $3 bitwise)"; else fail "$1" "$2 and $3 differ"; fi
  fi
}

parity_selected() { [ -z "${PARITY_ONLY:-}" ] || [[ $1 =~ $PARITY_ONLY ]]; }

# parity_case CASE ARGS...: gpt_ref.py (fp32 whatever training.precision says) and tptrain (NP=N: N
# ranks under mpirun) on cfg.yaml with ARGS, then their metrics compared within TOL (TOLS=bf16:
# within TOL_BF16).
parity_case() {
  local name=$1
  shift
  local sets=("$@")
  local mt=$WORK/$name.tptrain.jsonl mr=$WORK/$name.ref.jsonl
  local tol=("${TOL[@]}")
  [ "${TOLS:-}" = bf16 ] && tol=("${TOL_BF16[@]}")
  parity_selected "$name" || return 0
  rm -f "$mt" "$mr"
  echo
  echo "== case $name: ${sets[*]}"

  if ! REF_TIMEOUT=$TIMEOUT ref_py "$name.ref.log" "$REF/gpt_ref.py" --config cfg.yaml "${sets[@]}" \
      --set "logging.metrics_file=$mt" --out "$mr"; then
    show "$name.ref.log"
    fail "$name" "reference gpt_ref.py failed"
    return
  fi
  if [ -z "$TPTRAIN" ] || [ ! -x "$TPTRAIN" ]; then
    fail "$name" "TPTRAIN='$TPTRAIN' is not an executable file"
    return
  fi
  local rc=0
  local launch=()
  [ "${NP:-1}" -gt 1 ] && launch=(mpirun -np "$NP")
  timeout "$TIMEOUT" "${launch[@]}" "$TPTRAIN" --config cfg.yaml "${sets[@]}" --set "logging.metrics_file=$mt" \
      > "$name.tptrain.out" 2> "$name.tptrain.err" || rc=$?
  if [ "$rc" != 0 ]; then
    show "$name.tptrain.err"
    tail -n 5 "$name.tptrain.out" | sed 's/^/    stdout: /'
    fail "$name" "tptrain exited with status $rc$([ "$rc" = 124 ] && echo " (timed out after ${TIMEOUT}s)")"
    return
  fi
  if [ ! -s "$mt" ]; then
    tail -n 20 "$name.tptrain.out" | sed 's/^/    stdout: /'
    show "$name.tptrain.err"
    fail "$name" "tptrain exited 0 but wrote no metrics to logging.metrics_file=$mt"
    return
  fi
  if "$PY" "$REF/compare_metrics.py" "$mt" "$mr" --names tptrain,ref "${tol[@]}" > "$name.compare.log" 2>&1; then
    sed 's/^/    /' "$name.compare.log"
    pass "$name"
  else
    sed 's/^/    /' "$name.compare.log"
    fail "$name" "metrics differ (tolerances: ${tol[*]})"
  fi
}

# parity_selftest CASE [selftest.py options]: the reference's own checks, one line each
parity_selftest() {
  local name=$1
  shift
  parity_selected "$name" || return 0
  if "$PY" "$REF/selftest.py" --work "$WORK/selftest" "$@" > selftest.log 2>&1; then
    grep -E '^(PASS|FAIL|selftest:)' selftest.log | sed 's/^/    /'
    pass "$name"
  else
    show selftest.log
    fail "$name" "tests/reference/selftest.py $* failed"
  fi
}

parity_finish() {
  echo
  [ "$failed" -gt 0 ] && echo "failed: ${failures[*]}"
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
