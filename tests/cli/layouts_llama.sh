#!/usr/bin/env bash
# The LLaMA shape trains identically on every parallel layout (docs/ARCHITECTURE.md "Numerics"), as
# tests/cli/layouts.sh does for GPT-2: RMSNorm, SwiGLU ([gate; up] sharded along F), RoPE (base
# 500000), GQA with 2 KV groups of 8 heads (kv_channels 8 != 64/8; QKV sharded over TP by groups),
# an untied output layer and no linear biases. Per-step lm loss and grad norm of TP / PP (1F1B,
# interleaved, zb-h1) / DP with the distributed optimizer / sequence parallel / 3D runs within 1e-5
# relative of the one-rank run for 10 steps, and the final parameters too: the saved checkpoints'
# boxes assembled into global tensors (tests/tools/checkpoint_tensors.py; `tptrain export` writes
# GPT-2 only) within 1e-5 (Frobenius, per tensor) of the one-rank run's. Recompute (selective,
# full) changes nothing: losses, grad norms and final parameters bitwise those of recompute none,
# on 1 rank and on TP 2 x PP 2. With Qwen3's q/k norms (model.qk_layernorm) TP 2 x PP 2 x DP 2 with the
# distributed optimizer within 1e-5 of one rank (the norms' gradients summed over TP, their saved
# boxes tp_rank 0's), and recompute bitwise on 1 rank.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
CMP="$TPTRAIN_SRC/tests/tools/compare_runs.py"
CKT="$TPTRAIN_SRC/tests/tools/checkpoint_tensors.py"
$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 40000 --docs 50 --seed 3 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 8, group_query_attention: true, num_query_groups: 2,
        kv_channels: 8, ffn_hidden_size: 96, swiglu: true, normalization: RMSNorm,
        position_embedding_type: rope, rotary_base: 500000, untie_embeddings_and_output_weights: true,
        add_bias_linear: false, seq_length: 16, max_position_embeddings: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 8, global_batch_size: 16, train_iters: 10, cpu_threads: 1, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, weight_decay: 0.1, clip_grad: 0.5}
data: {path: $W/data, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML

# run NAME NP TP PP MBS [SCHEDULE ["section.key=value ..."]]: trains, metrics in $W/NAME.jsonl, the
# final checkpoint in $W/ckpt_NAME; then, unless REL=none, compares both with the run $REF (single)
# within REL (1e-5; 0: bitwise)
run() {
  local name=$1 np=$2 tp=$3 pp=$4 mbs=$5 sched=${6:-1f1b} extra=() kv
  local ref=${REF:-single} rel=${REL:-1e-5} what="np $2: TP $3 x PP $4, micro-batch $5, $sched${7:+, $7}"
  for kv in ${7:-}; do extra+=(--set "$kv"); done
  if ! timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" \
      --set parallel.tensor_model_parallel_size=$tp --set parallel.pipeline_model_parallel_size=$pp \
      --set parallel.pipeline_schedule=$sched --set training.micro_batch_size=$mbs \
      --set logging.metrics_file="$W/$name.jsonl" --set checkpoint.save="$W/ckpt_$name" \
      --set checkpoint.save_interval=1000 "${extra[@]}" > "$W/$name.log" 2>&1; then
    bad "$name: tptrain exited non-zero ($what)"; tail -20 "$W/$name.log"; return
  fi
  if [ "$rel" = none ]; then ok "$name (reference run; $what)"; return; fi
  local out
  if out=$($PY "$CMP" "$W/$ref.jsonl" "$W/$name.jsonl" --rel "$rel" &&
           $PY "$CKT" compare "$W/ckpt_$ref" "$W/ckpt_$name" --rel "$rel"); then
    ok "$name vs $ref within $rel ($what)"
  else
    bad "$name vs $ref within $rel ($what)"
  fi
  echo "$out"
}

REL=none run single 1 1 1 8
# the layouts (global batch 16: micro-batch 8 x 2 on one rank; the pipelines get 8 or 4 micro-batches)
run tp2 2 2 1 8
run pp2_1f1b 2 1 2 2
run pp2_v2 2 1 2 2 1f1b parallel.virtual_pipeline_model_parallel_size=2  # chunks of 1 layer: {0, 2}, {1, 3}
run pp2_zb 2 1 2 2 zb-h1
run dp2_distopt 2 1 1 4 1f1b "parallel.distributed_optimizer=true parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1 parallel.overlap_param_gather=true"
run tp2_sp 2 2 1 8 1f1b parallel.sequence_parallel=true
run tp2_pp2_dp2 8 2 2 2 1f1b "parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1"
run tp2_pp2_dp2_v2_distopt_sp 8 2 2 2 1f1b "parallel.virtual_pipeline_model_parallel_size=2 parallel.distributed_optimizer=true parallel.sequence_parallel=true parallel.overlap_grad_reduce=true parallel.ddp_bucket_size=1 parallel.overlap_param_gather=true"

# recompute: the same arithmetic again, so bitwise the same losses, grad norms and parameters
REL=0 run single_recompute_selective 1 1 1 8 1f1b training.recompute=selective
REL=0 run single_recompute_full 1 1 1 8 1f1b training.recompute=full
run tp2_pp2 4 2 2 4  # recompute none, also against the one-rank run (1e-5)
REF=tp2_pp2 REL=0 run tp2_pp2_recompute_selective 4 2 2 4 1f1b training.recompute=selective
REF=tp2_pp2 REL=0 run tp2_pp2_recompute_full 4 2 2 4 1f1b training.recompute=full
# Qwen3's q/k norms
QK=model.qk_layernorm=true
REL=none run qk_single 1 1 1 8 1f1b $QK
REF=qk_single run qk_tp2_pp2_dp2_distopt 8 2 2 2 1f1b "$QK parallel.distributed_optimizer=true"
REF=qk_single REL=0 run qk_single_recompute_selective 1 1 1 8 1f1b "$QK training.recompute=selective"
REF=qk_single REL=0 run qk_single_recompute_full 1 1 1 8 1f1b "$QK training.recompute=full"
finish
