#!/usr/bin/env bash
# tptrain generate on Mixture-of-Experts checkpoints (docs/MOE.md "Generation"): two tiny byte-level
# MoE models trained a few dozen iterations with a checkpoint, then greedy generation from it against
# the PyTorch reference's greedy decoding (tests/reference/greedy.py --checkpoint: the reference model
# of model_ref.py / moe_ref.py built from meta.json's config and the checkpoint's tensors, dropless).
#   (a) GPT-2-shaped: softmax top-2 of 4 GELU experts with biases on every layer, aux loss, and a
#       capacity factor of 1 in training (generation and the reference route dropless); trained on 1
#       rank and on PP 2 x DP 2 (the same weights up to 1e-5: the same greedy text);
#   (b) Llama-shaped (RMSNorm, RoPE, SwiGLU, untied output layer, no biases): a dense first layer, then
#       sigmoid top-2 of 6 experts, group-limited (3 groups, 1 chosen), scaled, with a gated shared
#       expert and the expert bias (aux-loss-free balancing: trained, saved, choosing at generation).
# Also: seeded sampling, and the Hugging Face export refuses a GPT-2-shaped MoE checkpoint with exit 2
# (Mixtral / Qwen-MoE need RMSNorm and SwiGLU: tests/cli/hf_moe.sh).
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1

# A small text: documents separated by blank lines.
cat > "$W/text.txt" <<'TEXT'
Old King Cole was a merry old soul, and a merry old soul was he.

Hickory dickory dock, the mouse ran up the clock. The clock struck one, the mouse ran down.

Little Bo Peep has lost her sheep and does not know where to find them.

Baa, baa, black sheep, have you any wool? Yes sir, yes sir, three bags full.

Hey diddle diddle, the cat and the fiddle, the cow jumped over the moon.

Little Jack Horner sat in the corner, eating his Christmas pie.

Peter Piper picked a peck of pickled peppers.

The mouse and the cat ran over the moon to the corner of the clock.
TEXT
if "$TPTRAIN" preprocess --input "$W/text.txt" --output-prefix "$W/text" --append-eod > "$W/pre.log" 2>&1; then
  ok "preprocess: $(tail -1 "$W/pre.log")"
else bad "preprocess"; cat "$W/pre.log"; fi

cat > "$W/cfg_a.yaml" <<YAML
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 64, vocab_size: 257,
        make_vocab_size_divisible_by: 64, num_moe_experts: 4, moe_ffn_hidden_size: 48, moe_router_topk: 2,
        moe_aux_loss_coeff: 1.0e-2, moe_expert_capacity_factor: 1.0}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 60, precision: fp32, seed: 5, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 1.0e-4, lr_warmup_iters: 4, weight_decay: 0.1, clip_grad: 1.0}
data: {path: $W/text, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 10}
YAML
cat > "$W/cfg_b.yaml" <<YAML
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 64, vocab_size: 257,
        make_vocab_size_divisible_by: 64, normalization: RMSNorm, swiglu: true, position_embedding_type: rope,
        untie_embeddings_and_output_weights: true, add_bias_linear: false, ffn_hidden_size: 96,
        num_moe_experts: 6, moe_ffn_hidden_size: 32, moe_router_topk: 2, "moe_layer_freq": [0, 1],
        moe_router_score_function: sigmoid, moe_router_num_groups: 3, moe_router_group_topk: 1,
        moe_router_topk_scaling_factor: 2.0, moe_shared_expert_intermediate_size: 48, moe_shared_expert_gate: true,
        moe_router_enable_expert_bias: true, moe_router_bias_update_rate: 1.0e-2}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 60, precision: fp32, seed: 7, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 1.0e-4, lr_warmup_iters: 4, weight_decay: 0.1, clip_grad: 1.0}
data: {path: $W/text, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 10}
YAML

# name:config:ranks:PP
runs="a:a:1:1 a_pp2dp2:a:4:2 b:b:1:1"
for r in $runs; do
  IFS=: read -r name cfg np pp <<< "$r"
  if timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg_$cfg.yaml" --set parallel.pipeline_model_parallel_size=$pp \
      --set checkpoint.save="$W/ck_$name" > "$W/train_$name.log" 2>&1; then
    ok "train $name ($np ranks, PP $pp): $(grep -o 'lm loss [0-9.E+-]*' "$W/train_$name.log" | sed -n '1p;$p' | paste -sd' ' | sed 's/ lm loss/ ->/')"
  else bad "train $name"; tail -15 "$W/train_$name.log"; fi
done

PROMPT="The mouse ran"
for r in $runs; do
  IFS=: read -r name _ <<< "$r"
  if timeout 120 "$TPTRAIN" generate --checkpoint "$W/ck_$name" --prompt "$PROMPT" --temperature 0 --max-new-tokens 50 \
       > "$W/greedy_$name.txt" 2> "$W/greedy_$name.err"; then
    grep -q "^$PROMPT" "$W/greedy_$name.txt" && [ "$(wc -c < "$W/greedy_$name.txt")" -gt $(( ${#PROMPT} + 10 )) ] &&
      ok "generate from MoE checkpoint $name: $(head -1 "$W/greedy_$name.txt")" ||
      { bad "generate output ($name)"; cat "$W/greedy_$name.txt" "$W/greedy_$name.err"; }
  else bad "generate from $name (exit $?)"; cat "$W/greedy_$name.err"; fi
done
cmp -s "$W/greedy_a.txt" "$W/greedy_a_pp2dp2.txt" && ok "greedy text identical from the checkpoints of 1 rank and PP2 x DP2" ||
  { bad "greedy text differs between layouts"; cat "$W/greedy_a_pp2dp2.txt"; }

# (b)'s expert biases were trained (updated each step) and saved: not all zero
$PY - "$W/ck_b" "$TPTRAIN_SRC/tests/tools" <<'PY' && ok "(b)'s checkpoint holds trained expert biases" || bad "expert bias in (b)'s checkpoint"
import sys
sys.path.insert(0, sys.argv[2])
import checkpoint_tensors
b = checkpoint_tensors.read_checkpoint(sys.argv[1])["h.1.mlp.router.expert_bias"]
print("     h.1 expert bias:", " ".join(f"{x:+.3f}" for x in b))
sys.exit(0 if abs(b).max() > 0 else 1)
PY

# the PyTorch reference's greedy decoding from the same checkpoints
for r in $runs; do
  IFS=: read -r name _ <<< "$r"
  if timeout 300 $PY "$TPTRAIN_SRC/tests/reference/greedy.py" --checkpoint "$W/ck_$name" --prompt "$PROMPT" \
       --max-new-tokens 50 > "$W/ref_$name.txt" 2> "$W/ref_$name.err"; then
    if cmp -s "$W/greedy_$name.txt" "$W/ref_$name.txt"; then
      ok "PyTorch reference's greedy continuation from $name = tptrain generate ($(tail -1 "$W/ref_$name.err" | sed 's/^greedy.py: //'))"
    else bad "reference greedy ($name) differs"; echo "     reference: $(cat "$W/ref_$name.txt")"; cat "$W/ref_$name.err"; fi
  else bad "greedy.py --checkpoint for $name"; tail -10 "$W/ref_$name.err"; fi
done

# sampling: seeded (same seed, same text), another seed another text
gen() { timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_b" --prompt "$PROMPT" --temperature 0.8 --top-k 20 \
          --seed "$1" --max-new-tokens 60 2>/dev/null; }
s1=$(gen 7); s2=$(gen 7); s3=$(gen 8)
[ -n "$s1" ] && [ "$s1" = "$s2" ] && [ "$s1" != "$s3" ] &&
  ok "MoE sampling (temperature 0.8, top-k 20) is a function of the seed: '$(echo "$s1" | head -1)'" ||
  { bad "seeded sampling"; printf '%s\n---\n%s\n---\n%s\n' "$s1" "$s2" "$s3"; }

# a GPT-2-shaped MoE model has no Hugging Face form (Mixtral / Qwen2-MoE are Llama-shaped): exit 2, naming it
timeout 60 "$TPTRAIN" export --checkpoint "$W/ck_a" --output "$W/hf_a" > "$W/export.txt" 2>&1
[ $? -eq 2 ] && grep -q "with 4 experts, which neither Hugging Face GPT-2, Llama, Mixtral, Qwen2-MoE nor Qwen3-MoE can hold: model.normalization is LayerNorm" "$W/export.txt" && [ ! -e "$W/hf_a/config.json" ] &&
  ok "export of an MoE checkpoint: exit 2 ($(head -1 "$W/export.txt" | cut -c1-100)...)" || { bad "export refusal"; cat "$W/export.txt"; }

finish
