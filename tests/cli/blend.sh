#!/usr/bin/env bash
# Blended datasets (data.path: [w1, prefix1, w2, prefix2, ...], data/blend.h) and `tptrain data`:
#  1. `tptrain data --json` against tests/reference/blend_ref.py, which reads the .idx/.bin with
#     numpy and recomputes Megatron's blending greedy from its definition: component, its sample,
#     documents spanned and the first 16 tokens of 10,000 global samples, for 3 weight vectors
#     (3 components; 0.001 vs 1; shuffled components);
#  2. a blended run with data.eod_mask_loss and data.reset_position_ids loses the same on TP / PP /
#     DP layouts as on one rank (1e-5 relative, as tests/cli/layouts.sh);
#  3. a blended run's checkpoint resumes bitwise on the same layout (and from the blend state);
#  4. bad blends exit 2 naming the entry; tptrain plan reports each component's epochs.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
R=$TPTRAIN_SRC/tests/reference
CMP=$TPTRAIN_SRC/tests/tools/compare_runs.py
{ $PYTHON "$R/make_tokens.py" --vocab 97 --tokens 20000 --docs 30 --seed 1 --megatron "$W/a" &&
  $PYTHON "$R/make_tokens.py" --vocab 97 --tokens 5000 --docs 11 --seed 2 --megatron "$W/b" &&
  $PYTHON "$R/make_tokens.py" --vocab 97 --tokens 3000 --docs 5 --seed 3 --megatron "$W/c" &&
  $PYTHON "$R/make_tokens.py" --vocab 200 --tokens 3000 --docs 5 --seed 4 --megatron "$W/wide"; } \
  > "$W/setup.log" 2>&1 || { cat "$W/setup.log"; echo "FAIL setup"; exit 1; }
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 8, global_batch_size: 16, train_iters: 10, cpu_threads: 1, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_iters: 10, weight_decay: 0.1, clip_grad: 0.5}
data: {path: [0.2, $W/a, 0.3, $W/b, 0.5, $W/c], shuffle: true, split: [90, 5, 5], eval_iters: 0}
logging: {log_interval: 1}
YAML

# --- 1. tptrain data against the independent reading
data_case() {  # name weights prefixes shuffle
  local name=$1 weights=$2 prefixes=$3 shuffle=$4 list="" i
  IFS=, read -ra ws <<< "$weights"; IFS=, read -ra ps <<< "$prefixes"
  for i in "${!ws[@]}"; do list+="${list:+, }${ws[$i]}, ${ps[$i]}"; done
  if ! "$TPTRAIN" data --config "$W/cfg.yaml" --set "data.path=[$list]" --set data.shuffle=$shuffle \
      --samples 0:10000 --json > "$W/$name.jsonl" 2> "$W/$name.err"; then
    cat "$W/$name.err"; bad "data $name: tptrain data failed"; return
  fi
  local extra=(); [ "$shuffle" = true ] && extra=(--shuffled)
  if out=$($PYTHON "$R/blend_ref.py" --json "$W/$name.jsonl" --seq 16 --split 90,5,5 --weights "$weights" \
      --prefixes "$prefixes" "${extra[@]}"); then ok "data $name: $out"; else echo "$out"; bad "data $name"; fi
}
data_case three 0.2,0.3,0.5 "$W/a,$W/b,$W/c" false
data_case unequal 0.001,1 "$W/a,$W/b" false
data_case four_shuffled 5,1,1,3 "$W/a,$W/b,$W/c,$W/a" true
n=$("$TPTRAIN" data --config "$W/cfg.yaml" --samples 3:7 | grep -c '^sample ')
[ "$n" = 4 ] && ok "data text output: 4 sample lines" || bad "data text output ($n lines)"
"$TPTRAIN" data --config "$W/cfg.yaml" --set "data.path=[1, $W/a, 2, $W/b]" --samples 0:2 --split valid --json \
    > "$W/valid.jsonl" 2>&1 &&
  [ "$(wc -l < "$W/valid.jsonl")" = 2 ] && ok "data --split valid" || { cat "$W/valid.jsonl"; bad "data --split valid"; }

# --- 2. layouts, with the document-aware loss and positions (token 5 plays the end of document)
DOC="data.eod_mask_loss=true data.reset_position_ids=true data.eod_token_id=5"
run() {  # name np tp pp mbs ["k=v ..."]
  local name=$1 np=$2 tp=$3 pp=$4 mbs=$5 extra=() kv
  for kv in $DOC ${6:-}; do extra+=(--set "$kv"); done
  timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.tensor_model_parallel_size=$tp \
    --set parallel.pipeline_model_parallel_size=$pp --set training.micro_batch_size=$mbs \
    --set logging.metrics_file="$W/$name.jsonl" "${extra[@]}" > "$W/$name.log" 2>&1
}
if run single 1 1 1 8; then ok "single (reference run)"; else tail -20 "$W/single.log"; bad "single"; fi
for spec in "tp2 2 2 1 8" "pp2_dp2 4 1 2 2" "tp2_pp2_dp2 8 2 2 2" "dp4 4 1 1 4"; do
  set -- $spec
  if run "$@" && out=$($PYTHON "$CMP" "$W/single.jsonl" "$W/$1.jsonl" --rel 1e-5); then ok "layout $1: $out"
  else tail -5 "$W/$1.log"; echo "${out:-}"; bad "layout $1"; fi
done
grep -q "component 2 (weight 0.5)" "$W/single.log" && grep -q "epochs" "$W/single.log" \
  && ok "start-up log reports the components" || bad "start-up log lacks the components"

# --- 3. resume bitwise on the same layout (PP2 x DP2): 10 straight vs 5 + resume 5
if run straight 4 1 2 2 "training.train_iters=10" &&
   run first 4 1 2 2 "training.train_iters=5 checkpoint.save=$W/ckpt" &&
   run resumed 4 1 2 2 "training.train_iters=10 checkpoint.load=$W/ckpt" &&
   grep -E '"iteration":([6-9]|10),' "$W/straight.jsonl" > "$W/straight_6_10.jsonl" &&
   out=$($PYTHON "$CMP" "$W/straight_6_10.jsonl" "$W/resumed.jsonl" --rel 0 --min-iters 5) &&
   grep -q "blend resumes at sample 80 from the checkpoint's per-component counts" "$W/resumed.log"; then
  ok "resume bitwise: $out"
else tail -5 "$W/resumed.log"; echo "${out:-}"; bad "resume"; fi

# --- 4. bad blends exit 2 naming the entry
expect2() {  # name pattern --set value
  local name=$1 pat=$2; shift 2
  "$TPTRAIN" data --config "$W/cfg.yaml" --samples 0:1 "$@" > "$W/$name.out" 2>&1; local rc=$?
  if [ $rc = 2 ] && grep -q -- "$pat" "$W/$name.out"; then ok "bad blend $name: $(tail -1 "$W/$name.out" | cut -c1-150)"
  else cat "$W/$name.out"; bad "bad blend $name (rc $rc, expected 2 and '$pat')"; fi
}
expect2 odd "the blend has 3 items, an odd number" --set "data.path=[0.5, $W/a, 0.5]"
expect2 zero "blend item 3 (component 2): the weight 0 must be positive" --set "data.path=[0.5, $W/a, 0, $W/b]"
expect2 negative "blend item 1 (component 1): the weight -2 must be positive" --set "data.path=[-2, $W/a, 1, $W/b]"
expect2 missing "data.path component 2 of 2 (weight 1, '$W/nope'): $W/nope.idx: not found" --set "data.path=[1, $W/a, 1, $W/nope]"
expect2 vocab "data.path component 3 of 3 (weight 1, '$W/wide').*outside the vocabulary \[0, 97)" \
  --set "data.path=[1, $W/a, 1, $W/b, 1, $W/wide]"
expect2 valid_path "data.valid_path component 1 of 1" --set "data.valid_path=[1, $W/nope]"
"$TPTRAIN" --config "$W/cfg.yaml" --set data.reset_attention_mask=true > "$W/ram.out" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "data.reset_attention_mask: is not supported" "$W/ram.out" && ok "reset_attention_mask: exit 2" \
  || { cat "$W/ram.out"; bad "reset_attention_mask (rc $rc)"; }

# --- plan: each component's documents, tokens and epochs
"$TPTRAIN" plan --config "$W/cfg.yaml" --json > "$W/plan.json" 2>&1 &&
  $PYTHON - "$W/plan.json" <<'PY' && ok "plan --json: per-component epochs" || { head -c 600 "$W/plan.json"; bad "plan data"; }
import json, sys
d = json.load(open(sys.argv[1]))["data"]
c = d["components"]
assert len(c) == 3 and d["train_samples"] == 160, d
assert [x["samples_drawn"] for x in c] == [32, 48, 80], c
assert all(abs(x["epochs"] - x["samples_drawn"] / x["train_samples"]) < 1e-12 for x in c), c
assert c[2]["documents"] == 5 and c[2]["train_tokens"] == 3000, c
PY
finish
