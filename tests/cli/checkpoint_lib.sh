# Sourced by checkpoint_faults.sh, checkpoint_async.sh and checkpoint_async_kill.sh (after lib.sh): the
# data, the config of a tiny model, layouts, and the helpers tpt, same_as, resumes, plan_halves, near,
# layouts_near and ckpt_f32_states (also optimizer_dtypes.sh, optimizer_fp16.sh, grads_bf16.sh).
$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 40000 --docs 50 --seed 3 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
# lr_decay_iters fixed: the schedule (and so every loss) does not depend on train_iters.
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 8, cpu_threads: 1, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_iters: 1000, weight_decay: 0.1, clip_grad: 0.5}
data: {path: $W/data, shuffle: true, split: [100, 0, 0], eval_iters: 0}
checkpoint: {save_interval: 4}
logging: {log_interval: 1}
YAML
# L1: DP 2 with the distributed optimizer (both ranks write); L2: TP 2; L3: PP 2 x CP 2
L1=(--set parallel.data_parallel_size=2 --set parallel.distributed_optimizer=true)
L2=(--set parallel.tensor_model_parallel_size=2)
L3=(--set parallel.pipeline_model_parallel_size=2 --set parallel.context_parallel_size=2)

# tpt NP NAME [args]: tptrain on NP ranks (NP=1: no mpirun), log $W/NAME.log; returns the exit status
tpt() {
  local np=$1 name=$2; shift 2
  if [ "$np" = 1 ]; then timeout 120 "$TPTRAIN" --config "$W/cfg.yaml" "$@" > "$W/$name.log" 2>&1
  else timeout 120 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" "$@" > "$W/$name.log" 2>&1; fi
}
# same_as REF NAME FIRST LAST: NAME.jsonl holds exactly iterations FIRST..LAST (all of them, LAST
# empty: any), equal to REF's (bitwise; within $TOL relative when TOL is set)
same_as() {
  $PY - "$1" "$W/$2.jsonl" "$3" "$4" "${TOL:-0}" <<'PY'
import json, sys
load = lambda p: {j["iteration"]: j for j in map(json.loads, filter(str.strip, open(p)))}
ref, got, first, tol = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3]), float(sys.argv[5])
last = int(sys.argv[4]) if sys.argv[4] else max(got, default=first - 1)
if sorted(got) != list(range(first, last + 1)):
    sys.exit(f"iterations {sorted(got)[:3]}..{sorted(got)[-3:]} != {first}..{last}")
for it in got:
    for k in ("lm_loss", "grad_norm"):
        if abs(got[it][k] - ref[it][k]) > tol * abs(ref[it][k]):
            sys.exit(f"iteration {it}: {k} {got[it][k]!r} != {ref[it][k]!r}")
PY
}
# resumes NAME NP DIR FROM LAST WARN REF [args]: loads DIR (a save directory or an iter_N) at
# iteration FROM (warning matching WARN unless empty), exits 0, trains FROM+1..LAST bitwise like REF
resumes() {
  local name=$1 np=$2 dir=$3 from=$4 last=$5 warn=$6 ref=$7; shift 7
  tpt "$np" "$name" --set checkpoint.load="$dir" --set training.train_iters="$last" \
      --set logging.metrics_file="$W/$name.jsonl" "$@"
  local rc=$? why=""
  [ $rc -eq 0 ] || why="exit status $rc"
  [ -z "$why" ] && ! grep -q "loaded checkpoint .*iter_$(printf %07d "$from") at iteration $from" "$W/$name.log" &&
    why="did not load iteration $from"
  [ -z "$why" ] && [ -n "$warn" ] && ! grep -Eq "WARNING: checkpoint.*$warn" "$W/$name.log" && why="no warning matching '$warn'"
  [ -z "$why" ] && { why=$(same_as "$ref" "$name" $((from + 1)) "$last") || true; }
  if [ -z "$why" ]; then ok "$name"; else bad "$name: $why"; grep -E "WARNING|rror|loaded" "$W/$name.log" | head -5; fi
}
# plan_halves FIELD WHAT SETS...: on 1 rank and on L1, `tptrain plan` with the --set arguments SETS gives
# half the stage's FIELD bytes of the plan without them, and its tensor bytes are lower by that half
plan_halves() {
  local field=$1 what=$2 lay args; shift 2
  for lay in "" L1; do
    args=(); [ "$lay" = L1 ] && args=("${L1[@]}")
    "$TPTRAIN" plan --config "$W/cfg.yaml" "$@" "${args[@]}" --json > "$W/plan_with$lay.json" 2> "$W/plan$lay.err" &&
      "$TPTRAIN" plan --config "$W/cfg.yaml" "${args[@]}" --json > "$W/plan_without$lay.json" 2>> "$W/plan$lay.err" ||
      bad "plan ${lay:-1 rank}: $(tail -2 "$W/plan$lay.err")"
    $PY - "$W/plan_with$lay.json" "$W/plan_without$lay.json" "$field" <<'PY' && ok "plan ${lay:-1 rank}: $what" || bad "plan ${lay:-1 rank}: $field"
import json, sys
w, f = (json.load(open(p))["stages"][0] for p in sys.argv[1:3])
k = sys.argv[3]
assert w[k] * 2 == f[k] > 0, (w[k], f[k])
assert f["tensor_bytes"] - w["tensor_bytes"] == w[k], (f["tensor_bytes"], w["tensor_bytes"])
PY
  done
}

# near REF NAME LOSS NORM: NAME.jsonl has iterations 1..12, each lm loss within relative LOSS and grad
# norm within relative NORM of REF's (prints the worst of each)
near() {
  $PY - "$1" "$W/$2.jsonl" "$3" "$4" <<'PY' 2>&1
import json, sys
load = lambda p: {j["iteration"]: j for j in map(json.loads, filter(str.strip, open(p)))}
ref, got = load(sys.argv[1]), load(sys.argv[2])
assert sorted(got) == list(range(1, 13)), sorted(got)
for k, tol in (("lm_loss", float(sys.argv[3])), ("grad_norm", float(sys.argv[4]))):
    worst = max(abs(got[i][k] - ref[i][k]) / abs(ref[i][k]) for i in got)
    print(f"{k} {worst:.1e}", end="  ")
    if worst > tol: sys.exit(f"exceeds {tol}")
PY
}
# layouts_near PREFIX REF LOSS NORM WHAT ARGS...: 12 iterations with ARGS on each of L1, L2 (2 ranks) and
# L3 (4 ranks) as PREFIX_<layout>, each near REF within LOSS / NORM
layouts_near() {
  local prefix=$1 ref=$2 loss=$3 norm=$4 what=$5 lay np why; shift 5
  for lay in L1 L2 L3; do
    eval "local args=(\"\${$lay[@]}\")"
    np=2; [ "$lay" = L3 ] && np=4
    tpt $np "${prefix}_$lay" "$@" "${args[@]}" --set training.train_iters=12 \
      --set logging.metrics_file="$W/${prefix}_$lay.jsonl" || bad "${prefix}_$lay: exit $?"
    why=$(near "$ref" "${prefix}_$lay" "$loss" "$norm") && ok "$what on $lay = one rank ($why)" || bad "$what on $lay: $why"
  done
}
# ckpt_f32_states DIR SCALES: checkpoint DIR's optimizer states (optimizer.state.*) are F32 tensors, and
# it holds SCALES fp16-state scales (optimizer.fp16_scale.*, F32 [1]) per tensor of the model
ckpt_f32_states() {
  $PY - "$1" "$2" <<'PY'
import json, struct, sys, glob
states = scales = 0
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(f, "rb") as h:
        n = struct.unpack("<Q", h.read(8))[0]
        for name, t in json.loads(h.read(n)).items():
            if name.startswith("optimizer.state."):
                assert t["dtype"] == "F32", (name, t["dtype"])
                states += 1
            elif name.startswith("optimizer.fp16_scale."):
                assert t["dtype"] == "F32" and t["shape"] == [1], (name, t)
                scales += 1
assert states > 0 and scales == int(sys.argv[2]) * (states // 2), (states, scales)  # exp_avg, exp_avg_sq per tensor
PY
}
