#!/usr/bin/env bash
# The bf16 gradient buffer (issue 41; parallel.grad_reduce_in_bf16, or the precision-aware optimizer's
# main_grads_dtype: bf16; docs/ARCHITECTURE.md "Numerics"). The parity with the PyTorch reference that
# keeps the same bf16 buffers is tests/cli/parity_torch.sh (cases k, l); here: the buffer changes
# training (a run with it is not the fp32 run) and stays near it, the two keys are the same run, TP 2
# agrees with one rank (the same accumulation order), DP 2's reductions agree whichever way
# they run (all-reduce, reduce-scatter, overlapped buckets: one rounding of a + b), the plan counts
# 2 bytes per element and equals the allocation, checkpoints are unchanged (a bf16-gradient run
# resumes bitwise, and from an fp32-gradient checkpoint), and the invalid combinations exit 2 (the CUDA
# backend's bf16 buffer: tests/gpu/grad_bf16_test.cpp against this backend).
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
source "$TPTRAIN_SRC/tests/cli/checkpoint_lib.sh"
G=(--set parallel.grad_reduce_in_bf16=true)
run() {  # NP NAME [args]: 12 iterations, metrics in $W/NAME.jsonl
  local np=$1 name=$2; shift 2
  tpt "$np" "$name" --set training.train_iters=12 --set logging.metrics_file="$W/$name.jsonl" "$@" ||
    bad "$name: exit $? ($(grep -m1 -E "rror" "$W/$name.log"))"
}

# --- one rank: the buffer matters, both keys are the same buffer ---------------------------------
run 1 fp32
run 1 g16 "${G[@]}" --set checkpoint.save="$W/g16_ck"
run 1 g16_main --set optimizer.use_precision_aware_optimizer=true --set optimizer.main_grads_dtype=bf16
grep -q "gradients: a bf16 buffer" "$W/g16.log" && ok "the start-up line names the bf16 gradient buffer" ||
  bad "no start-up line for the bf16 gradients"
why=$(TOL=1e-7 same_as "$W/fp32.jsonl" g16 1 12 2>&1) && bad "bf16 gradients changed nothing" ||
  ok "bf16 gradients change training ($why)"
TOL=5e-3 same_as "$W/fp32.jsonl" g16 1 12 > /dev/null && ok "... and stay within 5e-3 of fp32 over 12 iterations" ||
  bad "bf16 gradients: more than 5e-3 from fp32"
why=$(same_as "$W/g16.jsonl" g16_main 1 12) && ok "main_grads_dtype: bf16 is the same run as grad_reduce_in_bf16" ||
  bad "main_grads_dtype: bf16 vs grad_reduce_in_bf16: $why"

# --- layouts ---------------------------------------------------------------------------------------
# TP 2: each weight's gradient accumulated in the same order as on one rank (lm loss within 1e-6,
# grad norm 2e-4 relative; seen: 2.3e-7 and 9.2e-5)
run 2 g16_L2 "${G[@]}" "${L2[@]}"
TOL=2e-4 same_as "$W/g16.jsonl" g16_L2 1 12 > /dev/null && ok "TP 2 = one rank (within 2e-4)" || bad "TP 2 vs one rank"
# DP 2: each rank's buffer rounded per micro-batch, then a + b rounded once -- the same gradients through
# the all-reduce, the distributed optimizer's reduce-scatter and its overlapped one-layer buckets (the
# gradient norm's double sums go by other segments: within 1e-12)
run 2 g16_dp2 "${G[@]}" --set parallel.data_parallel_size=2
run 2 g16_L1 "${G[@]}" "${L1[@]}"
run 2 g16_L1_overlap "${G[@]}" "${L1[@]}" --set parallel.overlap_grad_reduce=true --set parallel.ddp_bucket_size=1 \
  --set parallel.overlap_param_gather=true
for n in g16_L1 g16_L1_overlap; do
  why=$(TOL=1e-12 same_as "$W/g16_dp2.jsonl" $n 1 12) && ok "DP 2: $n = the all-reduce" || bad "DP 2: $n: $why"
done
TOL=5e-3 same_as "$W/g16.jsonl" g16_dp2 1 12 > /dev/null && ok "DP 2 within 5e-3 of one rank" || bad "DP 2 vs one rank"
# PP 2 x CP 2 (the tied embedding's two copies, the CP ranks' partial sums): trains, near one rank
run 4 g16_L3 "${G[@]}" "${L3[@]}"
TOL=5e-3 same_as "$W/g16.jsonl" g16_L3 1 12 > /dev/null && ok "PP 2 x CP 2 within 5e-3 of one rank" || bad "PP 2 x CP 2"

# --- plan: 2 bytes per gradient, = the allocation --------------------------------------------------
for n in g16 g16_L1 g16_L3; do
  line=$(grep -m1 "^memory: allocated" "$W/$n.log")
  a=$(sed -E 's/^memory: allocated [0-9.]+ MiB \(([0-9]+) bytes\).*/\1/' <<< "$line")
  p=$(sed -E 's/.*\(plan: [0-9.]+ MiB \(([0-9]+) bytes\).*/\1/' <<< "$line")
  [ -n "$a" ] && [ "$a" = "$p" ] && ok "$n: plan = allocation ($a bytes)" || bad "$n: $line"
done
plan_halves gradient_bytes "bf16 gradients are half the fp32 bytes" "${G[@]}"

# --- checkpoints: no gradient in them; resume bitwise, and from fp32 gradients ----------------------
resumes g16_resume 1 "$W/g16_ck/iter_0000008" 8 12 "" "$W/g16.jsonl" "${G[@]}"
tpt 1 fp32_ck --set training.train_iters=4 --set checkpoint.save="$W/fp32_ck" || bad "fp32_ck"
run 1 fp32_then_g16 "${G[@]}" --set checkpoint.load="$W/fp32_ck" --set training.train_iters=8
TOL=5e-3 same_as "$W/fp32.jsonl" fp32_then_g16 5 8 > /dev/null && ok "an fp32-gradient checkpoint resumes with bf16 gradients" ||
  bad "fp32 -> bf16 gradients resume"

# --- refusals -------------------------------------------------------------------------------------
expect_exit2 no_flag "optimizer.main_grads_dtype: bf16 needs optimizer.use_precision_aware_optimizer: true" \
  "$TPTRAIN" --config "$W/cfg.yaml" --set optimizer.main_grads_dtype=bf16
expect_exit2 fp16 "a bf16 gradient buffer needs training.precision bf16 (or fp32), got fp16" \
  "$TPTRAIN" --config "$W/cfg.yaml" "${G[@]}" --set training.precision=fp16
expect_exit2 bad_dtype "optimizer.main_grads_dtype" \
  "$TPTRAIN" --config "$W/cfg.yaml" --set optimizer.use_precision_aware_optimizer=true --set optimizer.main_grads_dtype=fp16
finish
