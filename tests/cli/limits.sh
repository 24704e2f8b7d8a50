#!/usr/bin/env bash
# Hostile numbers (issue 29): every class of the second reliability round, each with a check that
# fails without its fix.
#  1. a huge value for each numeric option of generate, export, plan, data and preprocess (and a
#     train_iters near 2^63): exit 0 or 2 within a timeout, never a crash or an internal error;
#  2. start-up of a blend does not depend on the run's length: `plan` and a training run with
#     train_iters 10^11 over a 10-component blend take seconds of CPU (the epoch figures: the
#     weights' apportionment, marked "about");
#  3. tptrain plan of PP 64 x v 8 x 1024 micro-batches in seconds of CPU (~1 s alone); past the bound
#     on stages x chunks x micro-batches, exit 2 naming the keys;
#  4. blend and split weights whose sum overflows a double exit 2 naming the entry;
#  5. a damaged optimizer shard of the newest checkpoint (distributed optimizer, DP 2): export and
#     generate read that iteration's intact model shards, with a WARNING naming the shard.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
R=$TPTRAIN_SRC/tests/reference
{ $PY "$R/make_tokens.py" --vocab 257 --tokens 6000 --docs 12 --seed 1 --megatron "$W/a" &&
  $PY "$R/make_tokens.py" --vocab 257 --tokens 4000 --docs 9 --seed 2 --megatron "$W/b"; } \
  > "$W/setup.log" 2>&1 || { cat "$W/setup.log"; echo "FAIL setup"; exit 1; }
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 257,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 4, cpu_threads: 1, seed: 3, precision: fp32}
optimizer: {lr: 1.0e-3, min_lr: 1.0e-4}
data: {path: [0.3, $W/a, 0.7, $W/b], split: [90, 5, 5], eval_iters: 0}
checkpoint: {save_interval: 2}
logging: {log_interval: 1}
YAML

# expect NAME RC PATTERN -- command...: the exit status RC (within 60 s) and PATTERN in its output
expect() {
  local name=$1 want=$2 pat=$3; shift 4
  timeout 60 "$@" > "$W/$name.out" 2>&1; local rc=$?
  if [ "$rc" = "$want" ] && grep -q -- "$pat" "$W/$name.out"; then ok "$name: rc $rc $(grep -m1 -- "$pat" "$W/$name.out" | cut -c1-140)"
  else tail -5 "$W/$name.out"; bad "$name: rc $rc, expected $want and '$pat'"; fi
}

# timed NAME SECONDS RC PATTERN -- command...: as expect, and the command's CPU time (user + system,
# which a loaded CI machine does not inflate as it does the wall clock) under SECONDS
timed() {
  local name=$1 limit=$2; shift 2
  expect "$name" "$1" "$2" -- /usr/bin/time -f "cpu %U %S wall %e" -o "$W/$name.time" "${@:4}"
  if $PY -c "import sys; _, u, s, _, w = open(sys.argv[1]).read().split()[-5:]; t = float(u) + float(s); \
print(f'{t:.2f} s of CPU ({w} s wall)'); sys.exit(t >= float(sys.argv[2]))" "$W/$name.time" "$limit" > "$W/t.out" 2>&1
  then ok "$name: $(cat "$W/t.out")"; else cat "$W/t.out" "$W/$name.time"; bad "$name: more than $limit s of CPU"; fi
}

# --- 5 first (its checkpoint serves generate and export below): DP 2 with the distributed optimizer
if timeout 300 mpirun -np 2 "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.distributed_optimizer=true \
    --set checkpoint.save="$W/ck" > "$W/train.log" 2>&1; then ok "train DP2 distributed optimizer, saved at 2 and 4"
else tail -10 "$W/train.log"; bad "train"; fi
OPT=$W/ck/iter_0000004/optim_tp00_pp000_dp001.safetensors
if [ -f "$OPT" ]; then
  $PY - "$OPT" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:  # one byte of tensor data, far from the header
    f.seek(-5, 2); b = f.read(1); f.seek(-5, 2); f.write(bytes([b[0] ^ 0x10]))
PY
  expect export_damaged_optim 0 "WARNING: .*optim_tp00_pp000_dp001.safetensors: checksum mismatch" -- \
    "$TPTRAIN" export --checkpoint "$W/ck" --output "$W/hf"
  $PY -c "import json,sys; c=json.load(open(sys.argv[1])); assert c['tptrain_checkpoint']['iteration']==4, c" \
    "$W/hf/config.json" && ok "export of the save directory: iteration 4, not an older one" || bad "export exported another iteration"
  expect export_iter_damaged_optim 0 "WARNING: .*optim_tp00_pp000_dp001" -- \
    "$TPTRAIN" export --checkpoint "$W/ck/iter_0000004" --output "$W/hf4"
  expect generate_damaged_optim 0 "WARNING: .*optim_tp00_pp000_dp001.safetensors" -- \
    "$TPTRAIN" generate --checkpoint "$W/ck" --prompt "ab" --max-new-tokens 2 --temperature 0
  grep -q "(iteration 4," "$W/generate_damaged_optim.out" && ok "generate reads iteration 4" || bad "generate's iteration"
  # a damaged model shard still falls back to the older checkpoint (it is what export reads)
  MODEL=$(ls "$W"/ck/iter_0000004/model_*dp001*.safetensors 2>/dev/null | head -1)
  printf 'x' | dd of="$MODEL" bs=1 seek=$(( $(stat -c %s "$MODEL") - 3 )) conv=notrunc 2>/dev/null
  expect export_damaged_model 0 "falling back to an older checkpoint" -- \
    "$TPTRAIN" export --checkpoint "$W/ck" --output "$W/hf2"
  grep -q "(iteration 2;" "$W/export_damaged_model.out" && ok "a damaged model shard: iteration 2" || bad "model shard fallback"
else bad "no optimizer shard $OPT"; fi

# --- 1. huge values of every numeric option: exit 0 or 2, never 1 or a signal
CK=$W/ck/iter_0000002
G=("$TPTRAIN" generate --checkpoint "$CK" --prompt "a")
expect gen_threads_100000 2 "--threads: expected an integer >= 1 and <= 4096" -- "${G[@]}" --threads 100000
expect gen_threads_int_max 2 "--threads" -- "${G[@]}" --threads 2147483647
expect gen_threads_20_digits 2 "--threads" -- "${G[@]}" --threads 99999999999999999999
expect gen_max_new_tokens 0 "stopped: the text fills max_position_embeddings" -- \
  "${G[@]}" --max-new-tokens 9223372036854775807 --temperature 0
expect gen_top_k 0 "new tokens" -- "${G[@]}" --max-new-tokens 3 --top-k 9223372036854775807 --seed 9223372036854775807
expect gen_temperature 2 "--temperature" -- "${G[@]}" --temperature 1e309
expect export_shard_size 2 "--max-shard-size" -- "$TPTRAIN" export --checkpoint "$CK" --output "$W/x" \
  --max-shard-size 99999999999999999999999GB
P=("$TPTRAIN" plan --config "$W/cfg.yaml")
expect plan_world_int_max 2 "--world-size" -- "${P[@]}" --world-size 2147483647
expect plan_world_dp 2 "parallel.data_parallel_size: the world size 16777216" -- "${P[@]}" --world-size 16777216
expect plan_huge_doubles 0 "fits" -- "${P[@]}" --device-memory-gib 1e308 --peak-tflops 1e308 --intra-node-gbps 1e308 \
  --inter-node-gbps 1e308 --hbm-gbps 1e308
expect data_huge_a 2 "A is beyond the blend positions" -- "$TPTRAIN" data --config "$W/cfg.yaml" \
  --samples 999999999999999990:999999999999999999
expect data_huge_range 2 "more than 1048576 per call" -- "$TPTRAIN" data --config "$W/cfg.yaml" --samples 0:999999999999999999
expect data_huge_single 0 "^sample 999999999999999990 " -- "$TPTRAIN" data --config "$W/cfg.yaml" --set "data.path=$W/a" \
  --samples 999999999999999990:999999999999999991
printf '{"text": "hello"}\n' > "$W/in.jsonl"
expect preprocess_workers 2 "--workers: expected an integer >= 0 and <= 4096" -- "$TPTRAIN" preprocess \
  --input "$W/in.jsonl" --output-prefix "$W/pp" --workers 100000
expect train_iters_2_63 2 "training.train_iters: must be <= " -- "$TPTRAIN" --config "$W/cfg.yaml" \
  --set training.train_iters=9223372036854775807
expect eval_iters_2_62 2 "data.eval_iters: must be <= " -- "$TPTRAIN" --config "$W/cfg.yaml" \
  --set data.eval_iters=4611686018427387904
expect global_batch_null 2 "training.global_batch_size: null means" -- "$TPTRAIN" plan --config "$W/cfg.yaml" \
  --set training.global_batch_size=null --set training.micro_batch_size=16777216 --world-size 1048576

# --- 2. blend start-up independent of the run's length (10 components, 10^11 iterations)
TEN="[0.1, $W/a, 0.2, $W/b, 0.05, $W/a, 0.15, $W/b, 0.1, $W/a, 0.1, $W/b, 0.05, $W/a, 0.1, $W/b, 0.1, $W/a, 0.05, $W/b]"
timed plan_long_blend 3 0 "draw about" -- "${P[@]}" --set "data.path=$TEN" --set training.train_iters=100000000000
"${P[@]}" --set "data.path=$TEN" --set training.train_iters=100000000000 --json > "$W/plan.json" 2>&1
$PY - "$W/plan.json" <<'PY' && ok "plan --json: estimated counts sum to the run's samples, near w x N" || bad "plan --json estimate"
import json, sys
d = json.load(open(sys.argv[1]))["data"]
n, c = d["train_samples"], d["components"]
assert n == 400000000000 and sum(x["samples_drawn"] for x in c) == n, d
assert all(not x["samples_drawn_exact"] and abs(x["samples_drawn"] - x["normalized_weight"] * n) < 3 for x in c), c
PY
timed train_long_blend 5 0 "iteration        1/100000000000" -- "$TPTRAIN" --config "$W/cfg.yaml" \
  --set "data.path=$TEN" --set training.train_iters=100000000000 --set checkpoint.exit_duration_mins=0.00001

# --- 3. the plan's simulation: PP 64 x v 8 x 1024 micro-batches in seconds; past the bound, exit 2
BIG=(--set model.num_layers=512 --set parallel.pipeline_model_parallel_size=64
     --set parallel.virtual_pipeline_model_parallel_size=8 --set training.micro_batch_size=1 --world-size 64)
timed plan_pp64_v8 10 0 "bubble" -- "${P[@]}" "${BIG[@]}" --set training.global_batch_size=1024
expect plan_past_bound 2 "x 8 model chunks = 2097152 scheduled passes, more than 1048576" -- \
  "${P[@]}" "${BIG[@]}" --set training.global_batch_size=4096

# --- 4. weights whose sum overflows a double
expect blend_overflow 2 "blend item 3 (component 2): the weight 1e308 makes the weights' sum overflow" -- \
  "$TPTRAIN" data --config "$W/cfg.yaml" --samples 0:1 --set "data.path=[1e308, $W/a, 1e308, $W/b]"
expect split_overflow 2 "data.split: the weights' sum overflows a double at entry 2 (valid)" -- \
  "$TPTRAIN" data --config "$W/cfg.yaml" --samples 0:1 --set "data.split=[1e308, 1e308, 1]"
finish
