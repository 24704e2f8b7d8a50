#!/usr/bin/env bash
# Checkpoint resume (docs/ARCHITECTURE.md "Checkpoint format"): 16 iterations straight vs 8 + a resume of 8
# give bitwise-equal lm loss and grad norm at 1 rank and at TP2 x PP2 x DP2 (fp32); a checkpoint
# saved at TP2 x PP2 x DP2 resumes at 1 rank, TP4 x PP1 x DP2 and TP1 x PP4 x DP1 within 1e-5 of
# the uninterrupted run; fp16 resumes exactly too (loss scaler), and bf16 at TP2 x PP2 x DP2; bf16 and
# fp32 checkpoints resume in the other precision within 5e-3; with the distributed optimizer (every
# DP rank saves its blocks) resume is bitwise and its checkpoints load without it and vice versa;
# checkpoints load across schedules and model chunkings (interleaved, zb-h1, 1F1B); keep_last
# keeps the newest checkpoints.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
CMP="$TPTRAIN_SRC/tests/tools/compare_runs.py"
$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 40000 --docs 50 --seed 3 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
# lr_decay_iters is fixed so that the 8-iteration first half has the schedule of the 16-iteration run.
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 16, cpu_threads: 1, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_iters: 16, weight_decay: 0.1, clip_grad: 0.5}
data: {path: $W/data, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML

# tp np name [--set ...]: runs tptrain, metrics in $W/<name>.jsonl, log in $W/<name>.log
run() {
  local np=$1 tp=$2 pp=$3 name=$4; shift 4
  timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" \
    --set parallel.tensor_model_parallel_size=$tp --set parallel.pipeline_model_parallel_size=$pp \
    --set logging.metrics_file="$W/$name.jsonl" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { echo "  $name: tptrain exited $rc"; tail -15 "$W/$name.log"; }
  return $rc
}
# compare REF OTHER REL NAME: OTHER (a run resumed at iteration 8: iterations 9..16 only) must match
# REF's same iterations
compare() {
  local ref=$1 other=$2 rel=$3 name=$4
  local its; its=$(grep -o '"iteration":[0-9]*' "$other" | cut -d: -f2 | tr '\n' ' ')
  [ "$its" = "9 10 11 12 13 14 15 16 " ] || { bad "$name: resumed run logged iterations '$its', want 9..16"; return; }
  $PY - "$ref" "$other" "$W/$name.ref.jsonl" <<'PY'
import json, sys
want = {json.loads(l)["iteration"] for l in open(sys.argv[2]) if l.strip()}
with open(sys.argv[3], "w") as out:
    for l in open(sys.argv[1]):
        if l.strip() and json.loads(l)["iteration"] in want:
            out.write(l)
PY
  if out=$($PY "$CMP" "$W/$name.ref.jsonl" "$other" --rel "$rel" --min-iters 8 --keys "${KEYS:-lm_loss,grad_norm}"); then ok "$name"; else bad "$name"; fi
  echo "$out"
}

# --- 1 rank: 16 straight vs 8 + 8 --------------------------------------------------------------
run 1 1 1 straight1 || bad "straight 1 rank"
run 1 1 1 first1 --set training.train_iters=8 --set checkpoint.save="$W/ck1" &&
  run 1 1 1 resume1 --set checkpoint.load="$W/ck1" --set checkpoint.save="$W/ck1"
compare "$W/straight1.jsonl" "$W/resume1.jsonl" 0 "1 rank: 8 + resume 8 bitwise equal to 16 straight"

# --- fp16 at 1 rank: the loss scaler's state is restored too (its scale changes every few steps)
run 1 1 1 straight_fp16 --set training.precision=fp16 || bad "straight fp16"
run 1 1 1 first_fp16 --set training.precision=fp16 --set training.train_iters=8 --set checkpoint.save="$W/ck16" &&
  run 1 1 1 resume_fp16 --set training.precision=fp16 --set checkpoint.load="$W/ck16"
KEYS=lm_loss,loss_scale compare "$W/straight_fp16.jsonl" "$W/resume_fp16.jsonl" 0 "fp16, 1 rank: 8 + resume 8 bitwise equal (loss, loss scale)"

# --- TP2 x PP2 x DP2: 16 straight vs 8 + 8 ------------------------------------------------------
run 8 2 2 straight8 || bad "straight 8 ranks"
run 8 2 2 first8 --set training.train_iters=8 --set checkpoint.save="$W/ck8" &&
  run 8 2 2 resume8 --set checkpoint.load="$W/ck8"
ls "$W/ck8/iter_0000008" > "$W/ck8.files"
expect="meta.json model_tp00_pp000.safetensors model_tp00_pp001.safetensors model_tp01_pp000.safetensors model_tp01_pp001.safetensors optim_tp00_pp000_dp000.safetensors optim_tp00_pp001_dp000.safetensors optim_tp01_pp000_dp000.safetensors optim_tp01_pp001_dp000.safetensors"
if [ "$(tr '\n' ' ' < "$W/ck8.files" | sed 's/ $//')" = "$expect" ]; then ok "TP2xPP2xDP2 files: $expect"
else bad "TP2xPP2xDP2 files: got $(tr '\n' ' ' < "$W/ck8.files")"; fi
compare "$W/straight8.jsonl" "$W/resume8.jsonl" 0 "TP2xPP2xDP2: 8 + resume 8 bitwise equal to 16 straight"

# --- the TP2 x PP2 x DP2 checkpoint resumed on other layouts ------------------------------------
run 1 1 1 cross_1rank --set checkpoint.load="$W/ck8" --set training.micro_batch_size=8 &&
  compare "$W/straight8.jsonl" "$W/cross_1rank.jsonl" 1e-5 "saved TP2xPP2xDP2, resumed at 1 rank (1e-5)"
run 8 4 1 cross_tp4_dp2 --set checkpoint.load="$W/ck8" &&
  compare "$W/straight8.jsonl" "$W/cross_tp4_dp2.jsonl" 1e-5 "saved TP2xPP2xDP2, resumed at TP4xPP1xDP2 (1e-5)"
run 4 1 4 cross_pp4 --set checkpoint.load="$W/ck8" &&
  compare "$W/straight8.jsonl" "$W/cross_pp4.jsonl" 1e-5 "saved TP2xPP2xDP2, resumed at TP1xPP4xDP1 (1e-5)"
# and against the one-rank straight run too (layouts agree to 1e-5 among themselves)
compare "$W/straight1.jsonl" "$W/cross_tp4_dp2.jsonl" 1e-5 "TP4xPP1xDP2 resume vs the 1-rank straight run (1e-5)"

# --- schedules and model chunks: layers keep their global index, so a checkpoint saved with the
# interleaved schedule (PP2, 2 chunks per rank: layers {0, 2} and {1, 3}) resumes on 1 rank and
# with zb-h1, and one saved with 1F1B resumes interleaved
IL=(--set parallel.virtual_pipeline_model_parallel_size=2)
run 2 1 2 first_il "${IL[@]}" --set training.train_iters=8 --set training.micro_batch_size=8 --set checkpoint.save="$W/ckil" &&
  run 2 1 2 resume_il "${IL[@]}" --set training.micro_batch_size=8 --set checkpoint.load="$W/ckil" &&
  compare "$W/straight1.jsonl" "$W/resume_il.jsonl" 1e-5 "interleaved PP2 x 2 chunks: 8 + resume 8 vs the 1-rank straight run (1e-5)"
run 1 1 1 cross_il_to_1 --set checkpoint.load="$W/ckil" --set training.micro_batch_size=16 &&
  compare "$W/straight1.jsonl" "$W/cross_il_to_1.jsonl" 1e-5 "saved interleaved PP2 x 2 chunks, resumed at 1 rank (1e-5)"
run 2 1 2 cross_il_to_zb --set checkpoint.load="$W/ckil" --set training.micro_batch_size=8 --set parallel.pipeline_schedule=zb-h1 &&
  compare "$W/straight1.jsonl" "$W/cross_il_to_zb.jsonl" 1e-5 "saved interleaved PP2 x 2 chunks, resumed with zb-h1 at PP2 (1e-5)"
run 4 1 2 cross_1f1b_to_il --set checkpoint.load="$W/ck8" "${IL[@]}" --set training.micro_batch_size=4 &&
  compare "$W/straight8.jsonl" "$W/cross_1f1b_to_il.jsonl" 1e-5 "saved TP2xPP2xDP2 (1F1B), resumed interleaved at PP2 x 2 chunks x DP2 (1e-5)"

# --- bf16 (16-bit compute copy; the checkpoint holds the fp32 master weights): bitwise resume at
# TP2xPP2xDP2, and checkpoints load across precisions (fp32 <-> bf16) within bf16's tolerance
run 8 2 2 straight8_bf16 --set training.precision=bf16 || bad "straight bf16 8 ranks"
run 8 2 2 first8_bf16 --set training.precision=bf16 --set training.train_iters=8 --set checkpoint.save="$W/ck8bf16" &&
  run 8 2 2 resume8_bf16 --set training.precision=bf16 --set checkpoint.load="$W/ck8bf16"
compare "$W/straight8_bf16.jsonl" "$W/resume8_bf16.jsonl" 0 "bf16, TP2xPP2xDP2: 8 + resume 8 bitwise equal to 16 straight"
run 1 1 1 cross_bf16_to_fp32 --set checkpoint.load="$W/ck8bf16" --set training.micro_batch_size=8 &&
  KEYS=lm_loss compare "$W/straight8.jsonl" "$W/cross_bf16_to_fp32.jsonl" 5e-3 "saved bf16 at TP2xPP2xDP2, resumed fp32 at 1 rank (5e-3 of fp32)"
run 4 2 1 cross_fp32_to_bf16 --set checkpoint.load="$W/ck8" --set training.precision=bf16 &&
  KEYS=lm_loss compare "$W/straight8.jsonl" "$W/cross_fp32_to_bf16.jsonl" 5e-3 "saved fp32 at TP2xPP2xDP2, resumed bf16 at TP2xDP2 (5e-3 of fp32)"

# --- distributed optimizer: every DP rank saves the blocks of parameters and moments it owns, as
# boxes of the global tensors; bitwise resume on the same layout, and the checkpoint loads on layouts
# without it (and a checkpoint saved without it loads with it)
DO=(--set parallel.distributed_optimizer=true)
run 4 1 1 straight_do4 "${DO[@]}" || bad "straight DP4 + distributed optimizer"
run 4 1 1 first_do4 "${DO[@]}" --set training.train_iters=8 --set checkpoint.save="$W/ckdo4" &&
  run 4 1 1 resume_do4 "${DO[@]}" --set checkpoint.load="$W/ckdo4"
got=$(cd "$W/ckdo4/iter_0000008" && ls | tr '\n' ' ')
want="meta.json "; for d in 000 001 002 003; do want+="model_tp00_pp000_dp$d.safetensors "; done
for d in 000 001 002 003; do want+="optim_tp00_pp000_dp$d.safetensors "; done
if [ "$got" = "$want" ]; then ok "DP4 + distributed optimizer files: $got"; else bad "DP4 + distributed optimizer files: got $got"; fi
compare "$W/straight_do4.jsonl" "$W/resume_do4.jsonl" 0 "DP4 + distributed optimizer: 8 + resume 8 bitwise equal to 16 straight"
compare "$W/straight1.jsonl" "$W/resume_do4.jsonl" 1e-5 "DP4 + distributed optimizer resume vs the 1-rank straight run (1e-5)"
run 2 1 1 cross_do4_to_dp2 --set checkpoint.load="$W/ckdo4" --set training.micro_batch_size=8 &&
  compare "$W/straight1.jsonl" "$W/cross_do4_to_dp2.jsonl" 1e-5 "saved DP4 + distributed optimizer, resumed at DP2 without it (1e-5)"
run 4 2 1 cross_do4_to_tp2_sp --set checkpoint.load="$W/ckdo4" --set parallel.sequence_parallel=true &&
  compare "$W/straight1.jsonl" "$W/cross_do4_to_tp2_sp.jsonl" 1e-5 "saved DP4 + distributed optimizer, resumed at TP2xDP2 + sequence parallel (1e-5)"
run 4 1 1 cross_8_to_do4 "${DO[@]}" --set checkpoint.load="$W/ck8" &&
  compare "$W/straight8.jsonl" "$W/cross_8_to_do4.jsonl" 1e-5 "saved TP2xPP2xDP2, resumed at DP4 + distributed optimizer (1e-5)"
# bf16 with the fp32 master weights sharded, overlapped bucket reduce-scatters and parameter
# all-gathers, on TP2 x PP2 x DP2: bitwise resume, and onto DP4 + distributed optimizer
DOB=("${DO[@]}" --set training.precision=bf16 --set parallel.overlap_grad_reduce=true --set parallel.ddp_bucket_size=1
     --set parallel.overlap_param_gather=true)
run 8 2 2 straight8_do_bf16 "${DOB[@]}" || bad "straight bf16 TP2xPP2xDP2 + distributed optimizer"
run 8 2 2 first8_do_bf16 "${DOB[@]}" --set training.train_iters=8 --set checkpoint.save="$W/ck8dobf16" &&
  run 8 2 2 resume8_do_bf16 "${DOB[@]}" --set checkpoint.load="$W/ck8dobf16"
compare "$W/straight8_do_bf16.jsonl" "$W/resume8_do_bf16.jsonl" 0 "bf16, TP2xPP2xDP2 + distributed optimizer (overlapped): 8 + resume 8 bitwise equal"
KEYS=lm_loss compare "$W/straight8_bf16.jsonl" "$W/resume8_do_bf16.jsonl" 5e-3 "bf16 + distributed optimizer vs bf16 without it (5e-3)"

# --- keep_last: save every 2 iterations, keep 2 -------------------------------------------------
run 1 1 1 keep --set training.train_iters=10 --set checkpoint.save="$W/keep" --set checkpoint.save_interval=2 \
  --set checkpoint.keep_last=2
got=$(cd "$W/keep" && ls -d iter_* | tr '\n' ' '); latest=$(cat "$W/keep/latest_checkpointed_iteration.txt")
if [ "$got" = "iter_0000008 iter_0000010 " ] && [ "$latest" = 10 ]; then ok "keep_last 2: $got, latest $latest"
else bad "keep_last 2: got '$got', latest '$latest'"; fi

finish
