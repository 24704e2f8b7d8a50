#!/usr/bin/env bash
# tptrain plan (docs/PLAN.md): the JSON report of configs/gpt96.yaml has its keys and sane, hand-checked
# values (no MPI launch); on CPU configs the plan's bytes for rank 0's stage equal what the trainer
# allocated on rank 0 (its "memory: allocated ... (plan: ...)" start-up line), on 1 rank and on
# TP 2 x PP 2, fp32, bf16 and fp16 (16-bit tensors stored in 2 bytes), interleaved and zb-h1, for a
# GPT-2 and a Llama-shaped model (RMSNorm, SwiGLU, RoPE, GQA, untied, no biases); configs/llama3-8b.yaml
# and llama3-70b.yaml have Meta's parameter counts, fit 80 GiB, and their FLOPs are Megatron's formula
# with GQA and SwiGLU counted by hand. Mixture-of-Experts models too (E 4, top-2; GELU and SwiGLU experts,
# dense and MoE layers mixed, PP 2 with ZB-H1 and interleaving, full recompute, DP 2 with the distributed
# optimizer): plan = allocation.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"

# --- gpt96.yaml: keys and values --------------------------------------------------------------
# as it was before the search chose its layout (no distributed optimizer, no sequence parallelism, full
# recompute): the 18 B/parameter case that does not fit 80 GiB, and what the plan suggests for it
OLD96=(--set parallel.distributed_optimizer=false --set parallel.sequence_parallel=false --set parallel.overlap_param_gather=false
       --set parallel.overlap_grad_reduce=false --set training.recompute=full
       --set parallel.virtual_pipeline_model_parallel_size=null)
for gib in 80 141; do
  if "$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96.yaml" "${OLD96[@]}" --device-memory-gib $gib --json \
      > "$W/gpt96_$gib.json" 2> "$W/gpt96_$gib.err"; then ok "plan --json gpt96.yaml at $gib GiB runs (no mpirun)"
  else bad "plan --json gpt96.yaml at $gib GiB"; cat "$W/gpt96_$gib.err"; fi
done
if out=$($PYTHON - "$W/gpt96_80.json" "$W/gpt96_141.json" <<'PY'
import json, sys
p80, p141 = (json.load(open(f)) for f in sys.argv[1:3])
errors = []
def check(cond, what):
    if not cond: errors.append(what)
for k in ["world_size", "tp", "pp", "dp", "num_microbatches", "total_parameters", "flops_per_iteration",
          "bubble_fraction", "step_time_s", "mfu", "stages"]:
    check(k in p80, "missing key " + k)
for st in p80["stages"]:
    for k in ["stage", "parameters_per_rank", "weight_bytes", "gradient_bytes", "optimizer_bytes",
              "activation_bytes", "total_bytes", "fits"]:
        check(k in st, "stage missing key " + k)
check((p80["world_size"], p80["tp"], p80["pp"], p80["dp"]) == (192, 4, 6, 8), "grid")
check(p80["num_microbatches"] == 192, "1536 / (1 * 8) micro-batches")
l, h, s, V, Vp, B = 96, 12288, 2048, 50257, 50688, 1536
check(p80["total_parameters"] == l * (12 * h * h + 13 * h) + (V + s) * h + 2 * h, "total parameters (174.6B)")
flops = 72 * B * s * l * h * h * (1 + s / (12 * h) + Vp / (12 * l * h))
check(abs(p80["flops_per_iteration"] / flops - 1) < 1e-12, "FLOPs per iteration")
check(abs(p80["bubble_fraction"] - 5 / 197) < 1e-12, "bubble (PP-1)/(M+PP-1) = 5/197")
check(len(p80["stages"]) == 6, "6 stages")
for st in p80["stages"]:
    parts = sum(st[k] for k in ["weight_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes",
                                "workspace_bytes", "buffer_bytes", "backend_bytes"])
    check(parts == st["total_bytes"], "stage %d: total = sum of categories" % st["stage"])
    # the GPU backend's own buffers: cuBLASLt's 32 MiB; cuDNN's attention workspace for 96 / TP 4 = 24
    # heads of 128 channels, T 2048, micro-batch 1 as cudnn-frontend sizes it: softmax sums B H T fp32 +
    # deterministic: dP B H T T in 16 bits (T rounded to 64 / 128) | not: the fp32 dQ accumulator B H T D
    be = st["backend"]
    check(be["gemm_workspace_bytes"] == 32 << 20, "stage %d: cuBLASLt workspace" % st["stage"])
    det = be["attention_workspace_bytes_by_deterministic"]
    check(det["true"] == 24 * 2048 * 4 + 24 * 2048 * 2048 * 2 == be["attention_workspace_bytes"],
          "stage %d: deterministic cuDNN workspace %d" % (st["stage"], det["true"]))
    check(det["false"] == 24 * 2048 * 4 + 24 * 2048 * 128 * 4, "stage %d: cuDNN dQ accumulator %d" % (st["stage"], det["false"]))
    check(st["backend_bytes"] == sum(be[k] for k in ["gemm_workspace_bytes", "attention_workspace_bytes",
                                                      "scratch_bytes", "bias_grad_bytes"]), "backend parts")
    # the widest bias gradient (fc1's: 4h / TP 4 = h fp32) in a buffer of at least 1 MiB
    check(be["bias_grad_bytes"] == max(12288 * 4, 1 << 20), "stage %d: bias-gradient buffer" % st["stage"])
    # bf16 on a GPU: 18 B per element of the parameter buffer (no alignment padding at these sizes)
    check(st["weight_bytes"] + st["gradient_bytes"] + st["optimizer_bytes"] == 18 * st["parameters_per_rank"],
          "stage %d: 18 B/parameter" % st["stage"])
    check(7.2e9 < st["parameters_per_rank"] < 7.5e9, "stage %d: ~7.4B parameters per rank" % st["stage"])
    check(st["in_flight_microbatches"] == 6 - st["stage"], "stage %d: 1F1B in flight = PP - stage" % st["stage"])
    check(st["fits"] is False, "stage %d does not fit 80 GiB" % st["stage"])
check(p80["fits"] is False, "does not fit on 80 GiB")
fit = [x for x in p80["suggestions"] if x["fits"]]
check(any(x["change"].startswith("parallel.pipeline_model_parallel_size=") for x in fit), "suggests more PP")
check(any(x["change"] == "parallel.distributed_optimizer=true" and x["note"] == "" for x in fit),
      "suggests the distributed optimizer")
check(any(x["change"] == "parallel.distributed_optimizer=true parallel.sequence_parallel=true" for x in fit),
      "suggests the distributed optimizer with sequence parallelism")
bub = {b["schedule"]: b for b in p80["schedule_bubbles"]}
check(all(bub[k]["applies"] for k in ["1f1b", "interleaved v=2", "zb-h1"]), "three schedules compared")
check(bub["interleaved v=2"]["bubble_over_ideal"] < bub["1f1b"]["bubble_over_ideal"]
      and bub["zb-h1"]["bubble_over_ideal"] < bub["1f1b"]["bubble_over_ideal"]
      and bub["zb-h1"]["max_in_flight"] == bub["1f1b"]["max_in_flight"], "interleaved and zb-h1 bubbles below 1f1b's")
check(p141["fits"] is True and all(st["fits"] for st in p141["stages"]), "fits on 141 GiB with full recompute")
check(p141["stages"][0]["total_bytes_by_recompute"]["selective"] > 141 * 2**30, "selective would not fit 141 GiB")
check(0 < p80["step_time_s"] < 1000 and 0 < p80["mfu"] < 0.6, "step time and MFU sane")
print("; ".join(errors) if errors else "gpt96: stage 0 %.2f GiB, step %.1f s, MFU %.1f%%" % (
    p80["stages"][0]["total_bytes"] / 2**30, p80["step_time_s"], 100 * p80["mfu"]))
sys.exit(1 if errors else 0)
PY
); then ok "gpt96.yaml plan values ($out)"; else bad "gpt96.yaml plan values: $out"; fi

# gpt96.yaml as shipped fits 80 GiB
"$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96.yaml" > "$W/gpt96_shipped.txt" 2>&1
if grep -q "^fits: yes" "$W/gpt96_shipped.txt"; then ok "gpt96.yaml as shipped fits 80 GiB"
else bad "gpt96.yaml as shipped does not fit 80 GiB"; grep "^fits" "$W/gpt96_shipped.txt"; fi

# the distributed optimizer and sequence parallelism bring gpt96 under 80 GiB: model state at
# Megatron's 6 + 12/DP bytes per parameter (bf16: compute copy 2 + fp32 gradients 4 + 12/DP of fp32
# master weights and moments)
if out=$("$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96.yaml" --set parallel.distributed_optimizer=true \
          --set parallel.sequence_parallel=true --json | $PYTHON -c '
import json, sys
p = json.load(sys.stdin)
bad = [st["stage"] for st in p["stages"]
       if st["weight_bytes"] + st["gradient_bytes"] + st["optimizer_bytes"] != (6 + 12 / 8) * st["parameter_buffer"]]
peak = max(st["total_bytes"] for st in p["stages"]) / 2**30
print("peak %.2f GiB" % peak)
sys.exit(0 if p["fits"] and peak < 80 and not bad else 1)'); then
  ok "gpt96.yaml with the distributed optimizer and sequence parallelism fits 80 GiB, 7.5 B/parameter ($out)"
else bad "gpt96.yaml with the distributed optimizer and sequence parallelism: $out"; fi

# --storage is gone: every tensor is stored in its own dtype (the plan is what is allocated)
"$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96.yaml" --storage fp32_buffers > "$W/storage.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "unknown argument '--storage'" "$W/storage.out"; then ok "--storage: an unknown argument (exit 2)"
else bad "--storage (rc $rc)"; cat "$W/storage.out"; fi

# text report
"$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96.yaml" "${OLD96[@]}" > "$W/gpt96.txt" 2>&1
if grep -q "^fits: NO" "$W/gpt96.txt" && grep -q "distributed_optimizer=true  *[0-9.]*  fits" "$W/gpt96.txt" \
   && grep -q "^grid: TP 4 x PP 6 x DP 8 = 192 ranks" "$W/gpt96.txt" && grep -q "^step time estimate" "$W/gpt96.txt"; then
  ok "text report (grid, fit verdict, suggestions, step time)"
else bad "text report"; cat "$W/gpt96.txt"; fi
if "$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96-tiny.yaml" --json > "$W/tiny.json" &&
   $PYTHON -c "import json,sys; p=json.load(open('$W/tiny.json')); sys.exit(not (p['world_size']==192 and p['fits'] and 'storage' not in p and p['stages'][0]['layers']==16))"; then
  ok "gpt96-tiny.yaml: 192 CPU ranks, 16 layers per stage, fits"
else bad "gpt96-tiny.yaml plan"; fi

# bad input: exit 2 with a message
"$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96.yaml" --world-size 100 > "$W/bad.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "does not divide the world size 100" "$W/bad.out"; then ok "bad world size: exit 2"
else bad "bad world size (rc $rc)"; cat "$W/bad.out"; fi
"$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96.yaml" --peak-tflops fast > "$W/bad2.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "peak-tflops" "$W/bad2.out"; then ok "bad option value: exit 2"
else bad "bad option value (rc $rc)"; cat "$W/bad2.out"; fi
# --moe-imbalance: the busiest rank's expert work and all-to-all volume grow with it (the step time
# too, the dense parts not); below 1 is refused
if out=$($PYTHON - "$TPTRAIN" "$TPTRAIN_SRC/configs/mixtral-8x7b.yaml" <<'PY'
import json, subprocess, sys
tptrain, cfg = sys.argv[1:]
def plan(*a):
    return json.loads(subprocess.run([tptrain, "plan", "--config", cfg, "--json", *a], check=True, capture_output=True).stdout)
one, two = plan(), plan("--moe-imbalance", "2")
assert one["assumptions"]["moe_imbalance"] == 1 and two["assumptions"]["moe_imbalance"] == 2, (one["assumptions"], two["assumptions"])
t1, t2 = one["time"], two["time"]
assert t2["step_time_s"] > 1.2 * t1["step_time_s"], (t1["step_time_s"], t2["step_time_s"])
assert t2["ep_comm_s"] > 1.9 * t1["ep_comm_s"] > 0, (t1["ep_comm_s"], t2["ep_comm_s"])
assert t2["attention_s"] == t1["attention_s"], "attention does not depend on the experts' load"
print(f"step {t1['step_time_s']:.3f} -> {t2['step_time_s']:.3f} s, EP all-to-all {t1['ep_comm_s']:.3f} -> {t2['ep_comm_s']:.3f} s")
PY
); then ok "--moe-imbalance 2 on mixtral-8x7b.yaml: $out"; else bad "--moe-imbalance: $out"; fi
"$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/mixtral-8x7b.yaml" --moe-imbalance 0.5 > "$W/bad4.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--moe-imbalance: expected a finite number >= 1" "$W/bad4.out"; then ok "--moe-imbalance 0.5: exit 2"
else bad "--moe-imbalance 0.5 (rc $rc)"; cat "$W/bad4.out"; fi
# hardware options are finite: inf would give an MFU of 0 % or a zero step time
for opt in "--peak-tflops inf" "--hbm-gbps Infinity" "--inter-node-latency-us 1e999" "--compute-efficiency nan"; do
  "$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/gpt96.yaml" $opt > "$W/bad3.out" 2>&1; rc=$?
  if [ $rc -eq 2 ] && grep -q -- "${opt%% *}.*expected a finite number" "$W/bad3.out"; then ok "$opt: exit 2 ($(grep -o "expected a finite.*" "$W/bad3.out" | head -1))"
  else bad "$opt (rc $rc)"; cat "$W/bad3.out"; fi
done

# --- llama3-8b.yaml, llama3-70b.yaml: parameters, fit, FLOPs -------------------------------------
# The shapes by hand (Meta's Llama 3 / 3.1): parameters l (2h + h (H + 2G) D + H D h + 3 h F) + 2 V h + h
# (two RMSNorm weights, QKV, projection, [gate; up] and down per layer; embedding, untied output layer,
# final norm); iteration FLOPs Megatron's 12 B s l h^2 ((1 + G/H + s/(2h)) (H D / h) + (F/h) 1.5 +
# Vp/(2 l h)) with Vp the vocabulary padded to make_vocab_size_divisible_by x TP; the computed FLOPs
# with recompute none that plus the flash backward's rerun of the causal scores (l B s^2 H D).
for model in 8b 70b; do
  if "$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/llama3-$model.yaml" --json > "$W/llama3_$model.json" 2> "$W/llama3_$model.err" &&
     "$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/llama3-$model.yaml" > "$W/llama3_$model.txt" 2>&1; then
    ok "plan llama3-$model.yaml runs"
  else bad "plan llama3-$model.yaml"; cat "$W/llama3_$model.err"; continue; fi
  if out=$($PYTHON - "$W/llama3_$model.json" "$model" <<'PY'
import json, math, sys
p, model = json.load(open(sys.argv[1])), sys.argv[2]
errors = []
def check(cond, what):
    if not cond: errors.append(what)
l, h, H, G, D, F, V, s, target = {
    "8b": (32, 4096, 32, 8, 128, 14336, 128256, 8192, 8.03e9),
    "70b": (80, 8192, 64, 8, 128, 28672, 128256, 8192, 70.6e9)}[model]
n = l * (2 * h + h * (H + 2 * G) * D + H * D * h + 3 * h * F) + 2 * V * h + h
check(p["total_parameters"] == n, "total parameters %d, by hand %d" % (p["total_parameters"], n))
check(abs(p["total_parameters"] / target - 1) < 1e-3, "total parameters %d not within 0.1%% of %g" % (p["total_parameters"], target))
m = 128 * p["tp"]
Vp = -(-V // m) * m
check(p["padded_vocab_size"] == Vp, "padded vocabulary %d, by hand %d" % (p["padded_vocab_size"], Vp))
B = p["global_batch_size"]
check(1e6 <= B * s <= 4.3e6, "global batch %d x %d tokens: not 1-4M tokens" % (B, s))
flops = 12 * B * s * l * h * h * ((1 + G / H + s / (2 * h)) * (H * D / h) + (F / h) * 1.5 + Vp / (2 * l * h))
check(abs(p["flops_per_iteration"] / flops - 1) < 1e-12, "FLOPs per iteration %.6e, by hand %.6e" % (p["flops_per_iteration"], flops))
check(p["recompute"] == "none", "recompute none expected by the hardware FLOPs check")
hw = flops + l * B * s * s * H * D
check(abs(p["hardware_flops_per_iteration"] / hw - 1) < 1e-9, "computed FLOPs %.6e, by hand %.6e" % (p["hardware_flops_per_iteration"], hw))
mfu = p["flops_per_iteration"] / (p["step_time_s"] * p["world_size"] * 989e12)
check(abs(p["mfu"] / mfu - 1) < 1e-9 and 0.3 < p["mfu"] < 0.6, "MFU %g, by hand %g" % (p["mfu"], mfu))
peak = max(st["total_bytes"] for st in p["stages"])
check(p["fits"] is True and all(st["fits"] for st in p["stages"]) and peak < 80 * 2**30, "does not fit 80 GiB")
check(p["world_size"] == p["tp"] * p["pp"] * p["dp"] and p["world_size"] >= 8, "grid")
print("; ".join(errors) if errors else "%.4gB parameters, %d GPUs (TP %d x PP %d x DP %d), peak %.2f GiB, %.2f s/iteration, MFU %.1f%%" % (
    p["total_parameters"] / 1e9, p["world_size"], p["tp"], p["pp"], p["dp"], peak / 2**30, p["step_time_s"], 100 * p["mfu"]))
sys.exit(1 if errors else 0)
PY
); then ok "llama3-$model.yaml: $out"; else bad "llama3-$model.yaml plan values: $out"; fi
  if grep -q "^fits: yes" "$W/llama3_$model.txt" && grep -q "^step time estimate" "$W/llama3_$model.txt"; then
    ok "llama3-$model.yaml text report: fits 80 GiB"
  else bad "llama3-$model.yaml text report"; cat "$W/llama3_$model.txt"; fi
done
if "$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/llama-tiny.yaml" --world-size 8 --json > "$W/llama_tiny.json" &&
   $PYTHON -c "import json,sys; p=json.load(open('$W/llama_tiny.json')); sys.exit(not (p['fits'] and (p['tp'], p['pp'], p['dp']) == (2, 2, 2)))"; then
  ok "llama-tiny.yaml: TP 2 x PP 2 x DP 2 on 8 CPU ranks"
else bad "llama-tiny.yaml plan"; fi

# --- CPU configs: plan bytes == trainer's allocation on rank 0 ------------------------------------
$PYTHON "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 40000 --docs 50 --seed 3 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; exit 1; }
# every tensor a multiple of 16 floats (B*S = 64), so the allocator's 64-byte rounding adds nothing
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 3, cpu_threads: 1, seed: 7, device: cpu}
data: {path: $W/data, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
cfg=$W/cfg.yaml  # the config compare runs
# The plan's tensor bytes (tensor_bytes: the total less the GPU backend's own buffers, which CPU ranks
# do not have) against the trainer's line, and iterations 2 and 3 without a call of the allocator
compare() {  # name np tp pp extra-set...
  local name=$1 np=$2 tp=$3 pp=$4; shift 4
  local sets=(--set parallel.tensor_model_parallel_size=$tp --set parallel.pipeline_model_parallel_size=$pp)
  for s in "$@"; do sets+=(--set "$s"); done
  if ! timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$cfg" "${sets[@]}" > "$W/$name.log" 2>&1; then
    bad "$name: training exited non-zero"; tail -20 "$W/$name.log"; return
  fi
  if ! "$TPTRAIN" plan --config "$cfg" --world-size "$np" "${sets[@]}" --json > "$W/$name.json" 2> "$W/$name.plan.err"; then
    bad "$name: plan exited non-zero"; cat "$W/$name.plan.err"; return
  fi
  local line allocated logged planned
  line=$(grep "^memory: allocated" "$W/$name.log")
  allocated=$(sed -E 's/^memory: allocated [0-9.]+ MiB \(([0-9]+) bytes\).*/\1/' <<< "$line")
  logged=$(sed -E 's/.*\(plan: [0-9.]+ MiB \(([0-9]+) bytes\).*/\1/' <<< "$line")
  planned=$($PYTHON -c "import json; print(json.load(open('$W/$name.json'))['stages'][0]['tensor_bytes'])")
  if [ -n "$line" ] && [ "$allocated" = "$planned" ] && [ "$logged" = "$planned" ]; then
    ok "$name (np $np, TP $tp x PP $pp $*): allocated on rank 0 = plan = $planned bytes"
  else
    bad "$name (np $np, TP $tp x PP $pp $*): allocated '$allocated', logged plan '$logged', tptrain plan '$planned'"
    echo "$line"
  fi
  if grep -q "^memory: no device allocation or free in iterations 2..3 (after the first)" "$W/$name.log"; then
    ok "$name: no allocation or free in iterations 2 and 3"
  else bad "$name: the allocator was called after iteration 1: $(grep -m1 'memory: no device\|device allocator' "$W/$name.log")"; fi
}
compare single_fp32 1 1 1
compare tp2_pp2_fp32 4 2 2
compare tp2_pp2_bf16_selective 4 2 2 training.precision=bf16 training.recompute=selective
compare pp2_gpipe_bf16_full 2 1 2 training.precision=bf16 training.recompute=full parallel.pipeline_schedule=gpipe
compare tp2_dp2_fp16 4 2 1 training.precision=fp16
compare dp4_distopt_bf16 4 1 1 training.precision=bf16 parallel.distributed_optimizer=true
# optimizer.store_param_remainders: the bf16 parameters + 2-byte remainders (whole, or the owned blocks)
compare single_bf16_remainders 1 1 1 training.precision=bf16 optimizer.store_param_remainders=true
compare dp4_distopt_bf16_remainders 4 1 1 training.precision=bf16 parallel.distributed_optimizer=true optimizer.store_param_remainders=true
# FP8 training (tensorwise, CPU): each chunk's scratch for the codes of the largest GEMM input, weight and
# output gradient (twice: rowwise and columnwise), and its scales
compare fp8_tp2_sp_hybrid 2 2 1 training.precision=bf16 training.fp8_format=hybrid training.fp8_recipe=tensorwise \
  parallel.sequence_parallel=true
# fp8_wgrad: false: the output gradients in one layout (no second scratch)
compare fp8_nowgrad 1 1 1 training.precision=bf16 training.fp8_format=hybrid training.fp8_wgrad=false
# delayed scaling: each chunk's scales and amaxes of its FP8 GEMM inputs on the device (2 chunks per
# rank, layers 0 and 3 in bf16: rank 0's chunk of layer 0 has none), and with an asynchronous save the
# host copy of the scales and histories (checked against the plan at the first save)
compare fp8_delayed_vp2 2 1 2 training.precision=bf16 training.fp8_format=hybrid training.fp8_recipe=delayed \
  training.fp8_amax_history_len=16 training.first_last_layers_bf16=true parallel.virtual_pipeline_model_parallel_size=2 \
  checkpoint.save="$W/fp8_delayed_ck" checkpoint.save_interval=2 checkpoint.async_save=true
# blockwise scaling: the block scales of the largest layouts (hidden 256: every TP 2 rank's dimension a
# multiple of 128)
compare fp8_blockwise_tp2_sp 2 2 1 training.precision=bf16 training.fp8_format=hybrid training.fp8_recipe=blockwise \
  parallel.sequence_parallel=true model.hidden_size=256
# ... at sequence 256 (a rank's 128 tokens whole 128-token blocks): the norms' shards kept as 128 x 1 codes
# and their scales (docs/FP8.md "Sequence parallelism")
compare fp8_blockwise_tp2_sp_codes 2 2 1 training.precision=bf16 training.fp8_format=hybrid training.fp8_recipe=blockwise \
  parallel.sequence_parallel=true model.hidden_size=256 model.seq_length=256 training.micro_batch_size=1 \
  training.global_batch_size=4
# FP8 layers saving their GEMM inputs' codes (docs/FP8.md "Saved inputs"): ln_1's, ln_2's and SwiGLU's
# outputs as FP8 codes with their scales (blockwise: one per 128 x 1 block) in place of the bf16
# tensors, which take one shared scratch; with selective recompute (its shared attention core too)
compare fp8_saved_blockwise_swiglu 1 1 1 training.precision=bf16 training.fp8_format=hybrid training.fp8_recipe=blockwise \
  model.hidden_size=256 model.swiglu=true model.ffn_hidden_size=256 model.normalization=RMSNorm
compare fp8_saved_tensorwise_selective 2 1 2 training.precision=bf16 training.fp8_format=hybrid training.fp8_recipe=tensorwise \
  model.swiglu=true model.ffn_hidden_size=128 training.recompute=selective
# zb-h1's stash in FP8 layers: the output gradients' columnwise FP8 codes and scales B makes for W (with
# sequence parallelism gathered as codes; blockwise one scale per 128 x 1 block), in 16 bits in the bf16
# layers (layer 0 here)
compare fp8_zb_tp2_sp 4 2 2 training.precision=bf16 training.fp8_format=hybrid training.fp8_recipe=tensorwise \
  parallel.sequence_parallel=true parallel.pipeline_schedule=zb-h1
compare fp8_zb_blockwise_first_bf16 2 1 2 training.precision=bf16 training.fp8_format=hybrid training.fp8_recipe=blockwise \
  model.hidden_size=256 parallel.pipeline_schedule=zb-h1 training.first_last_layers_bf16=true training.num_layers_at_end_in_bf16=0
# the precision-aware optimizer's bf16 moments (2 + 2 bytes per owned element)
compare dp2_distopt_bf16_moments 2 1 1 training.precision=bf16 parallel.distributed_optimizer=true optimizer.store_param_remainders=true \
  optimizer.use_precision_aware_optimizer=true optimizer.exp_avg_dtype=bf16 optimizer.exp_avg_sq_dtype=bf16
# Transformer Engine's scaled fp16 states: 2 bytes per moment and master weight, and the optimizer's two
# scale tables; with an asynchronous save the host copy of the scales (checked at the first save)
compare dp2_distopt_bf16_fp16_states 2 1 1 training.precision=bf16 parallel.distributed_optimizer=true \
  optimizer.use_precision_aware_optimizer=true optimizer.exp_avg_dtype=fp16 optimizer.exp_avg_sq_dtype=fp16 \
  optimizer.main_params_dtype=fp16 checkpoint.save="$W/fp16_states_ck" checkpoint.save_interval=2 checkpoint.async_save=true
compare pp2_dp2_distopt_fp32 4 1 2 parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1
# the bf16 gradient buffer (2 bytes per element), reduced in overlapped buckets
compare pp2_dp2_distopt_bf16_grads 4 1 2 training.precision=bf16 parallel.grad_reduce_in_bf16=true \
  parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1
# the schedules beyond 1F1B: 2 model chunks per rank (each its scratch and receive buffers, their
# activation slots in one pool), and zb-h1's stash of the GEMMs' output gradients per slot
compare pp2_interleaved_bf16 2 1 2 training.precision=bf16 parallel.virtual_pipeline_model_parallel_size=2
# ... whose slots are one pool for the chunks (as many as the rank holds at once), also with 4 chunks
# per rank under full recompute
compare pp2_v4_bf16_full 2 1 2 training.precision=bf16 model.num_layers=8 parallel.virtual_pipeline_model_parallel_size=4 \
  training.recompute=full
compare tp2_pp2_zb_bf16_selective 4 2 2 training.precision=bf16 training.recompute=selective parallel.pipeline_schedule=zb-h1

# The Llama shape (RMSNorm, SwiGLU, RoPE, GQA 4 heads / 2 groups, kv_channels 32 != 64 / 4, untied
# output layer, no biases). Every tensor a multiple of 64 bytes again: B*S = 64 tokens (32 per TP rank
# with sequence parallelism), per TP rank 1 KV group, ffn 48, 56 vocabulary rows; RoPE's fp32 inverse
# frequencies rot/2 = 16 (kv_channels 64 with rotary_percent 0.5 in the last case). With TP 1 rank 0
# holds the untied output layer too. With data.reset_position_ids every stage keeps each slot's
# positions for RoPE, and the trainer stages positions / loss weights (data.eod_mask_loss) per micro-batch.
cat > "$W/llama.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, group_query_attention: true, num_query_groups: 2,
        kv_channels: 32, ffn_hidden_size: 96, swiglu: true, normalization: RMSNorm, position_embedding_type: rope,
        rotary_base: 500000, untie_embeddings_and_output_weights: true, add_bias_linear: false,
        seq_length: 16, vocab_size: 97, make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 3, cpu_threads: 1, seed: 7, device: cpu}
data: {path: $W/data, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
cfg=$W/llama.yaml
compare llama_single_fp32 1 1 1
compare llama_tp2_fp32 2 2 1
compare llama_tp2_sp_dp2_bf16 4 2 1 training.precision=bf16 parallel.sequence_parallel=true
compare llama_pp2_zb_bf16 2 1 2 training.precision=bf16 parallel.pipeline_schedule=zb-h1
compare llama_dp2_distopt_bf16 2 1 1 training.precision=bf16 parallel.distributed_optimizer=true
compare llama_bf16_selective 1 1 1 training.precision=bf16 training.recompute=selective
compare llama_bf16_full 1 1 1 training.precision=bf16 training.recompute=full
# the layernorm recompute module: ln1 / ln2 in the shared scratch, not per layer (with ZB-H1 and SP;
# interleaved, in the pool's slots)
compare llama_tp2_sp_pp2_zb_layernorm_bf16 4 2 2 training.precision=bf16 training.recompute=selective \
  "training.recompute_modules=[core_attn, layernorm]" parallel.pipeline_schedule=zb-h1 parallel.sequence_parallel=true
compare llama_pp2_interleaved_layernorm_bf16 2 1 2 training.precision=bf16 parallel.virtual_pipeline_model_parallel_size=2 \
  training.recompute=selective "training.recompute_modules=[core_attn, layernorm]"
compare llama_pp2_interleaved_bf16 2 1 2 training.precision=bf16 parallel.virtual_pipeline_model_parallel_size=2
compare llama_pp2_interleaved_doc_masks 2 1 2 training.precision=bf16 parallel.virtual_pipeline_model_parallel_size=2 \
  data.reset_position_ids=true data.eod_mask_loss=true
compare llama_3d_sp_distopt_bf16_selective 8 2 2 training.precision=bf16 training.recompute=selective \
  parallel.sequence_parallel=true parallel.distributed_optimizer=true
compare llama_pp2_tp2_doc_masks_bf16 4 2 2 training.precision=bf16 data.reset_position_ids=true data.eod_mask_loss=true
compare llama_tp2_fp16_rope_scaled 2 2 1 training.precision=fp16 model.kv_channels=64 model.rotary_percent=0.5 \
  model.rotary_interleaved=true \
  "model.rope_scaling={factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8}"

# Mixture-of-Experts (docs/MOE.md, docs/PLAN.md "Mixture-of-Experts"): E = 4 experts of width 48, top-2,
# on the GPT-2 and the Llama shapes. Every tensor a multiple of 64 bytes again: the experts' rows
# B*S*k = 128, their weights 4 x 48 x 32 (SwiGLU 4 x 2 x 48 x 32, in the Llama shape 4 x 48 x 64), the
# router 4 x 32, its logits 64 x 4. The experts lie after every dense tensor in their own replica group
# (ExpertData, over EDP = DP with TP 1 and EP 1), which the distributed optimizer pads and shards apart;
# a gated shared expert of width 32 (dense tensors of the MoE layer, TP-split as the dense MLP);
# moe_layer_freq [0, 1, 0, 1] mixes dense and MoE layers on each stage (and in each interleaved chunk).
MOE=(model.num_moe_experts=4 model.moe_ffn_hidden_size=48 model.moe_router_topk=2)
cfg=$W/cfg.yaml
compare moe_single_fp32 1 1 1 "${MOE[@]}"
compare moe_freq01_bf16 1 1 1 "${MOE[@]}" training.precision=bf16 "model.moe_layer_freq=[0, 1, 0, 1]"
compare moe_swiglu_bf16_full 1 1 1 "${MOE[@]}" model.swiglu=true model.ffn_hidden_size=96 training.precision=bf16 training.recompute=full
compare moe_gelu_fp16_selective 1 1 1 "${MOE[@]}" training.precision=fp16 training.recompute=selective
compare moe_shared_gate_pp2_zb_bf16 2 1 2 "${MOE[@]}" model.moe_shared_expert_intermediate_size=32 \
  model.moe_shared_expert_gate=true training.precision=bf16 parallel.pipeline_schedule=zb-h1
compare moe_pp2_zb_bf16 2 1 2 "${MOE[@]}" training.precision=bf16 parallel.pipeline_schedule=zb-h1
# EP 2 (a pool of the experts' rows per chunk; at 2x the balanced load no layer outgrows it here)
compare moe_ep2_pp2_zb_bf16 4 1 2 "${MOE[@]}" training.precision=bf16 parallel.pipeline_schedule=zb-h1 \
  parallel.expert_model_parallel_size=2 model.moe_kept_rows_factor=2
compare moe_pp2_full_fp32 2 1 2 "${MOE[@]}" training.recompute=full "model.moe_layer_freq=[0, 1, 0, 1]"
# interleaved: each slot of the rank's pool holds its MoE layers' kept rows after its dense tensors
# (rank 0: layer 0 MoE with a gated shared expert in chunk 0, layer 2 dense in chunk 1), also with EP 2
compare moe_pp2_interleaved_freq10_bf16 2 1 2 "${MOE[@]}" training.precision=bf16 "model.moe_layer_freq=[1, 0, 0, 1]" \
  model.moe_shared_expert_intermediate_size=32 model.moe_shared_expert_gate=true parallel.virtual_pipeline_model_parallel_size=2
compare moe_ep2_pp2_interleaved_fp32 4 1 2 "${MOE[@]}" parallel.expert_model_parallel_size=2 \
  parallel.virtual_pipeline_model_parallel_size=2 model.moe_dispatch_bound_factor=2
compare moe_dp2_distopt_bf16 2 1 1 "${MOE[@]}" training.precision=bf16 parallel.distributed_optimizer=true
# EP 4 with the dispatch bound at 4x the balanced load: the most an EP rank of 4 can receive, so it never grows
compare moe_ep4_bound4_bf16 4 1 1 "${MOE[@]}" training.precision=bf16 parallel.expert_model_parallel_size=4 \
  model.moe_dispatch_bound_factor=4
compare moe_pp2_dp2_distopt_freq01_fp32 4 1 2 "${MOE[@]}" "model.moe_layer_freq=[0, 1, 0, 1]" \
  parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1
# experts split over TP (ETP = TP 2, sequence parallelism): each expert's width 24 on a rank; the rows
# of its GEMMs, the padded TP gather and its maps are the TP group's (2 x the rank's bound)
compare moe_tp2_sp_ep2_etp2_bf16 4 2 1 "${MOE[@]}" training.precision=bf16 parallel.sequence_parallel=true \
  parallel.expert_model_parallel_size=2 parallel.expert_tensor_parallel_size=2
# the allgather dispatcher: the EP group's tokens (and their 16-bit staging), its assignments' maps,
# the experts' output rows at the bound
compare moe_allgather_ep2_etp2_bf16 4 2 1 "${MOE[@]}" training.precision=bf16 parallel.sequence_parallel=true \
  parallel.expert_model_parallel_size=2 parallel.expert_tensor_parallel_size=2 model.moe_token_dispatcher_type=allgather
compare moe_allgather_ep4_fp32 4 1 1 "${MOE[@]}" parallel.expert_model_parallel_size=4 model.moe_token_dispatcher_type=allgather
compare moe_tp2_sp_etp2_swiglu_fp32 2 2 1 "${MOE[@]}" model.swiglu=true model.ffn_hidden_size=96 \
  parallel.sequence_parallel=true parallel.expert_tensor_parallel_size=2
compare moe_pp2_interleaved_freq10_bf16 2 1 2 "${MOE[@]}" training.precision=bf16 "model.moe_layer_freq=[1, 0, 0, 1]" \
  parallel.virtual_pipeline_model_parallel_size=2
# selective recompute with moe_act: no kept activations per layer, one scratch for the layer at hand
# (also in the interleaved pool's slots); full recompute on EP 2: the layers' one set of kept rows
compare moe_ep2_swiglu_moe_act_bf16 2 1 1 "${MOE[@]}" model.swiglu=true model.ffn_hidden_size=96 training.precision=bf16 \
  parallel.expert_model_parallel_size=2 training.recompute=selective "training.recompute_modules=[core_attn, moe_act]"
compare moe_pp2_interleaved_moe_act_bf16 2 1 2 "${MOE[@]}" training.precision=bf16 parallel.virtual_pipeline_model_parallel_size=2 \
  training.recompute=selective "training.recompute_modules=[core_attn, moe_act]"
compare moe_ep2_full_fp32 2 1 1 "${MOE[@]}" parallel.expert_model_parallel_size=2 training.recompute=full
# the moe module: one set of kept rows (a gated shared expert's too) and the rerun's output, also interleaved
compare moe_pp2_interleaved_moe_module_bf16 2 1 2 "${MOE[@]}" training.precision=bf16 parallel.virtual_pipeline_model_parallel_size=2 \
  model.moe_shared_expert_intermediate_size=32 model.moe_shared_expert_gate=true training.recompute=selective \
  "training.recompute_modules=[core_attn, layernorm, moe]"
# the distributed optimizer with DP 1 but EDP 2 (TP 2, ETP 1): the expert weights' states sharded over EDP
compare moe_tp2_sp_etp1_edp2_distopt_bf16 2 2 1 "${MOE[@]}" training.precision=bf16 parallel.sequence_parallel=true \
  parallel.expert_tensor_parallel_size=1 parallel.distributed_optimizer=true
# FP8 in MoE layers, delayed: the experts' codes at the dispatch bound's rows, every expert's scales and
# amaxes per layer (2E more GEMMs), and with an asynchronous save their host copy
compare moe_fp8_delayed_tp2_async 2 2 1 "${MOE[@]}" training.precision=bf16 parallel.sequence_parallel=true training.fp8_format=hybrid \
  training.fp8_recipe=delayed training.fp8_amax_history_len=4 checkpoint.save="$W/moe_fp8_ck" checkpoint.save_interval=2 \
  checkpoint.async_save=true
cfg=$W/llama.yaml
compare moe_llama_pp2_zb_dp2_distopt_bf16 4 1 2 "${MOE[@]}" training.precision=bf16 parallel.pipeline_schedule=zb-h1 \
  parallel.distributed_optimizer=true "model.moe_layer_freq=[0, 1, 1, 1]"
compare moe_llama_full_bf16 1 1 1 "${MOE[@]}" training.precision=bf16 training.recompute=full

# FP8 in the step-time model (plan/step_time.h "FP8"): configs/llama3-8b.yaml on its 64 H100s. Its FP8 GEMMs
# take less time than bf16's and more than half (2x peak at 0.55 of it, plus the casts); fp8_wgrad:
# false and first_last_layers_bf16 in between; current scaling's extra amax pass costs more than
# delayed's; an A100 has no FP8 (exit 2).
l8=("$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/llama3-8b.yaml" --world-size 64 --gpu h100 --json)
F8P=(--set training.precision=bf16 --set training.fp8_format=hybrid)
if "${l8[@]}" --set training.precision=bf16 > "$W/f8_bf16.json" && "${l8[@]}" "${F8P[@]}" > "$W/f8_delayed.json" &&
   "${l8[@]}" "${F8P[@]}" --set training.fp8_recipe=tensorwise > "$W/f8_tw.json" &&
   "${l8[@]}" "${F8P[@]}" --set training.fp8_wgrad=false > "$W/f8_nowgrad.json" &&
   "${l8[@]}" "${F8P[@]}" --set training.first_last_layers_bf16=true > "$W/f8_firstlast.json" &&
   f8out=$($PYTHON - "$W" <<'PY'
import json, sys
g = {n: json.load(open(f"{sys.argv[1]}/f8_{n}.json"))["time"]["gemm_s"] for n in ("bf16", "delayed", "tw", "nowgrad", "firstlast")}
print(" ".join(f"{n} {v:.3f} s" for n, v in g.items()))
sys.exit(not (g["bf16"] / 2 < g["delayed"] < g["tw"] < g["bf16"] and g["delayed"] < g["nowgrad"] < g["bf16"]
              and g["delayed"] < g["firstlast"] < g["bf16"]))
PY
); then ok "FP8 step time, llama3-8b's GEMMs: $f8out"; else bad "FP8 step time: ${f8out:-plan failed}"; fi
# ... and in MoE layers (configs/qwen3-30b-a3b.yaml): attention's, the experts' grouped and the shared
# GEMMs in FP8 (not the router's): less GEMM time than bf16's, more than half of it
q3=("$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/qwen3-30b-a3b.yaml" --gpu h100 --json --set training.precision=bf16)
if "${q3[@]}" > "$W/q3_bf16.json" && "${q3[@]}" --set training.fp8_format=hybrid > "$W/q3_fp8.json" &&
   q3out=$($PYTHON - "$W" <<'PY'
import json, sys
g = {n: json.load(open(f"{sys.argv[1]}/q3_{n}.json"))["time"]["gemm_s"] for n in ("bf16", "fp8")}
print(" ".join(f"{n} {v:.3f} s" for n, v in g.items()))
sys.exit(not (g["bf16"] / 2 < g["fp8"] < g["bf16"]))
PY
); then ok "FP8 step time, qwen3-30b-a3b's GEMMs (MoE layers): $q3out"; else bad "FP8 MoE step time: ${q3out:-plan failed}"; fi
expect_exit2 fp8_a100 "training.fp8_format: the a100 has no FP8 tensor cores (--gpu a100)" \
  "$TPTRAIN" plan --config "$TPTRAIN_SRC/configs/llama3-8b.yaml" --world-size 64 --gpu a100 "${F8P[@]}"
finish
