#!/usr/bin/env bash
# optimizer.store_param_remainders (issue 41; core/dtype.h): the fp32 master weights held as the
# bf16 compute copy plus a 16-bit remainder train bitwise as fp32 master weights do. In bf16 at
# 1 rank, TP2, PP2 and DP2 with the distributed optimizer (sharded remainders): the same lm loss and
# grad norm at every step, and byte-identical checkpoint files (fp32 master weights and moments on
# disk either way). Checkpoints interchange: an fp32-master checkpoint resumes with remainders, and
# a remainders checkpoint without, bitwise as the uninterrupted run. Any precision but bf16 exits 2.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
CMP="$TPTRAIN_SRC/tests/tools/compare_runs.py"
$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 30000 --docs 40 --seed 4 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
# lr and weight decay large enough that the weights move by many bf16 steps (and hit ties)
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 8, cpu_threads: 1, seed: 3, precision: bf16}
optimizer: {lr: 1.0e-2, min_lr: 1.0e-3, lr_warmup_iters: 2, lr_decay_iters: 8, weight_decay: 0.1, clip_grad: 0.5}
data: {path: $W/data, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
run() {  # name np tp pp [--set ...]: metrics in $W/<name>.jsonl, checkpoint in $W/<name>.ck
  local name=$1 np=$2 tp=$3 pp=$4; shift 4
  timeout 120 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.tensor_model_parallel_size=$tp \
    --set parallel.pipeline_model_parallel_size=$pp --set logging.metrics_file="$W/$name.jsonl" \
    --set checkpoint.save="$W/$name.ck" "$@" > "$W/$name.log" 2>&1 ||
    { echo "  $name: tptrain exited $?"; tail -8 "$W/$name.log"; return 1; }
}
same_files() {  # A B: every safetensors file of the last checkpoint byte for byte the same
  local a b n=0
  for a in "$1"/iter_0000008/*.safetensors; do
    b="$2/iter_0000008/$(basename "$a")"
    cmp -s "$a" "$b" || { echo "  $(basename "$a") differs"; return 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] && echo "  $n checkpoint files byte-identical"
}
R=(--set optimizer.store_param_remainders=true)
DO=(--set parallel.distributed_optimizer=true)
for layout in "1 1 1" "2 2 1" "2 1 2" "2 1 1 ${DO[*]}"; do
  read -r np tp pp extra <<< "$layout"
  name="np${np}_tp${tp}_pp${pp}${extra:+_distopt}"
  # shellcheck disable=SC2086
  run "${name}_fp32" $np $tp $pp $extra && run "${name}_rem" $np $tp $pp $extra "${R[@]}" || { bad "$name: runs"; continue; }
  if grep -q "16-bit remainders (optimizer.store_param_remainders)" "$W/${name}_rem.log" &&
     out=$($PY "$CMP" "$W/${name}_fp32.jsonl" "$W/${name}_rem.jsonl" --rel 0 --min-iters 8) &&
     same_files "$W/${name}_fp32.ck" "$W/${name}_rem.ck"; then
    ok "$name: remainders bitwise as fp32 master weights (losses, grad norms, checkpoints)"
  else bad "$name: remainders vs fp32 master weights"; fi
  echo "${out:-}"
done
# and the runs trained (a loss that does not move would pass the above too)
if $PY -c "import json,sys; l=[json.loads(x)['lm_loss'] for x in open(sys.argv[1])]; sys.exit(not l[-1] < l[0] - 0.05)" \
   "$W/np1_tp1_pp1_rem.jsonl"; then ok "the loss falls over the 8 steps"; else bad "the runs did not train"; fi

# checkpoints interchange (DP2, distributed optimizer): 4 iterations one way, 4 resumed the other
ck_cross() {  # name first-args -- resume-args
  local name=$1; shift
  local first=() ; while [ "$1" != "--" ]; do first+=("$1"); shift; done; shift
  run "${name}_a" 2 1 1 "${DO[@]}" --set training.train_iters=4 "${first[@]}" &&
    run "${name}_b" 2 1 1 "${DO[@]}" --set checkpoint.load="$W/${name}_a.ck" "$@" || { bad "$name: runs"; return; }
  $PY - "$W/np2_tp1_pp1_distopt_fp32.jsonl" "$W/${name}_b.jsonl" "$W/${name}.ref.jsonl" <<'PY'
import json, sys
want = {json.loads(l)["iteration"] for l in open(sys.argv[2]) if l.strip()}
open(sys.argv[3], "w").writelines(l for l in open(sys.argv[1]) if l.strip() and json.loads(l)["iteration"] in want)
PY
  if out=$($PY "$CMP" "$W/${name}.ref.jsonl" "$W/${name}_b.jsonl" --rel 0 --min-iters 4) &&
     same_files "$W/np2_tp1_pp1_distopt_fp32.ck" "$W/${name}_b.ck"; then ok "$name: resumed bitwise as the uninterrupted run"
  else bad "$name"; fi
  echo "$out"
}
ck_cross fp32_to_remainders -- "${R[@]}"
ck_cross remainders_to_fp32 "${R[@]}" --

for p in fp32 fp16; do
  expect_exit2 "remainders_$p" "optimizer.store_param_remainders: needs training.precision bf16" \
    "$TPTRAIN" --config "$W/cfg.yaml" --set training.precision=$p "${R[@]}"
done
finish
