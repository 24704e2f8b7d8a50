#!/usr/bin/env bash
# Hugging Face Llama checkpoints in and out (interop/hf/llama.h; README "Continue pretraining from a
# Hugging Face Llama checkpoint"). A random LlamaForCausalLM checkpoint from
# tests/reference/make_hf_llama.py (bf16, 2 layers, hidden 64, 4 heads / 2 KV heads of head_dim 24,
# ffn 96, byte-level vocabulary 257, untied, RMSNorm weights 1 + noise, Llama 3.1 rope scaling, 3
# shards with model.safetensors.index.json and the old rotary_emb.inv_freq buffers; weights of std
# 0.15, so that attention is far from uniform: two query heads of a group swapped, or one q channel
# pair, or the RoPE convention, move the first loss by 1.5e-2 to 1e-1, far above the 1e-4 bound) must
#  (a) train from model.init_from with the per-step losses of the PyTorch reference model initialised
#      from the same files (tests/reference/gpt_ref.py --init, its own loader hf_llama_ref.py) on 1
#      rank and on TP2 x PP2 x DP2; with model.rotary_interleaved: true (q/k rows permuted into that
#      order) the same losses as tptrain's rotate-half run;
#  (b) round trip: imported on TP2 x PP2 x DP2, one step at lr 0, exported with --max-shard-size
#      (several shards + index): every tensor's bytes and dtype equal the input's, config.json's keys
#      equal; also fp16 storage, a tied model with biases and without GQA in transformers 5's
#      rope_parameters form (exported --dtype fp16 from an fp32 run on TP2), and the interleaved run
#      (exported --dtype bf16);
#  (c) tptrain generate on the imported-then-trained checkpoint: greedy tokens the reference model's
#      best on the exported Llama directory;
#  (d) exit 2 naming the problem: a missing shard, a shape that disagrees with config.json, config.json
#      disagreeing with the model config, an unknown architecture, an index naming a tensor twice, a
#      shard named with '..' or by an absolute path (both existing files), a bad --dtype / --max-shard-size.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
REF=$TPTRAIN_SRC/tests/reference
TOL=(--loss-abs 1e-4 --gradnorm-rel 1e-3 --lr-rel 1e-6)

$PY "$REF/make_hf_llama.py" --out "$W/hf" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 24 --ffn 96 \
  --vocab 257 --positions 64 --rope-theta 10000 --rope-scaling 4,1,16,64 --dtype bf16 --shards 3 --inv-freq --std 0.15 \
  --seed 3 > "$W/make.log" 2>&1 &&
$PY "$REF/make_hf_llama.py" --out "$W/hf_tied" --layers 2 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 257 \
  --positions 64 --rope-theta 500000 --rope-parameters --tied --bias --dtype f16 --std 0.15 --seed 4 >> "$W/make.log" 2>&1 &&
$PY "$REF/make_tokens.py" --vocab 257 --tokens 1400 --docs 7 --pattern markov --seed 1 --megatron "$W/tokens" \
  >> "$W/make.log" 2>&1 || { cat "$W/make.log"; echo "FAIL inputs"; echo "0 passed, 1 failed"; exit 1; }
sed 's/^/     /' "$W/make.log"

# the model config that matches $W/hf/config.json (seq 16 of its 64 positions)
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, ffn_hidden_size: 96, seq_length: 16,
        max_position_embeddings: 64, vocab_size: 257, make_vocab_size_divisible_by: 64, layernorm_epsilon: 1.0e-5,
        normalization: RMSNorm, swiglu: true, position_embedding_type: rope, rotary_base: 10000,
        rope_scaling: {factor: 4.0, low_freq_factor: 1.0, high_freq_factor: 16.0, original_max_position_embeddings: 64},
        group_query_attention: true, num_query_groups: 2, kv_channels: 24,
        untie_embeddings_and_output_weights: true, add_bias_linear: false, init_from: $W/hf}
training: {micro_batch_size: 8, global_batch_size: 8, train_iters: 10, precision: fp32, seed: 5, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_style: cosine, lr_decay_iters: 10,
            weight_decay: 0.1, adam_beta1: 0.9, adam_beta2: 0.95, adam_eps: 1.0e-8, clip_grad: 1.0}
data: {path: $W/tokens, shuffle: false, split: [1, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
# the second checkpoint: tied, biases, 4 KV heads = multi-head attention, rope_parameters with theta 5e5
sed -e 's/group_query_attention: true, num_query_groups: 2, kv_channels: 24/kv_channels: 16/' \
    -e 's/untie_embeddings_and_output_weights: true, add_bias_linear: false/add_bias_linear: true/' \
    -e 's/rotary_base: 10000,/rotary_base: 500000,/' -e '/rope_scaling/d' -e "s|init_from: $W/hf}|init_from: $W/hf_tied}|" \
    "$W/cfg.yaml" > "$W/cfg_tied.yaml"

source "$TPTRAIN_SRC/tests/cli/hf_lib.sh"

# --- (a) training from init_from = the reference from the same files --------------------------------
timeout 300 $PY "$REF/gpt_ref.py" --config "$W/cfg.yaml" --out "$W/ref.jsonl" --threads 1 > "$W/ref.log" 2>&1 &&
  grep -q "Hugging Face Llama weights" "$W/ref.log" || { bad "reference gpt_ref.py --init $W/hf"; tail -5 "$W/ref.log"; }
tptrain one 1 --set checkpoint.save="$W/ck_one" && compare one ref "init_from the 3-shard bf16 Llama: tptrain (1 rank) = reference" \
  "${TOL[@]}" --min-iters 10
grep -q "init_from: Hugging Face Llama $W/hf/model.safetensors.index.json (3 shards, BF16/F32" "$W/one.log" &&
  ok "the start-up log names the index, 3 shards, their dtypes" || { bad "start-up log"; grep init_from "$W/one.log"; }
tptrain grid 8 --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 \
  --set training.micro_batch_size=2 && compare grid ref "init_from on TP2 x PP2 x DP2 = reference" "${TOL[@]}" --min-iters 10
tptrain inter 1 --set model.rotary_interleaved=true &&
  compare inter one "rotary_interleaved: true (q/k rows permuted at import) = rotate-half run (1e-5)" \
  --loss-abs 1e-5 --gradnorm-rel 1e-5 --lr-rel 1e-9 --min-iters 10
CFG=$W/cfg_tied.yaml tptrain tied 2 --set parallel.tensor_model_parallel_size=2 --set training.train_iters=3 &&
  timeout 300 $PY "$REF/gpt_ref.py" --config "$W/cfg_tied.yaml" --steps 3 --out "$W/ref_tied.jsonl" --threads 1 \
    > "$W/ref_tied.log" 2>&1 &&
  compare tied ref_tied "tied, biases, no GQA, rope_parameters, fp16 storage, TP2 = reference" "${TOL[@]}" --min-iters 3

# --- (b) round trips ---------------------------------------------------------------------------------
tptrain rt_grid 8 --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2 \
  --set training.micro_batch_size=2 --set training.precision=bf16 --set checkpoint.save="$W/ck_grid" "${ZERO[@]}" &&
  roundtrip grid "$W/hf" --max-shard-size 100KB
echo "     $(ls "$W/out_grid" | tr '\n' ' ')"
tptrain rt_inter 1 --set model.rotary_interleaved=true --set checkpoint.save="$W/ck_inter" "${ZERO[@]}" &&
  roundtrip inter "$W/hf" --dtype bf16 --max-shard-size 1GB
CFG=$W/cfg_tied.yaml tptrain rt_tied 2 --set parallel.tensor_model_parallel_size=2 --set checkpoint.save="$W/ck_tied" \
  "${ZERO[@]}" && roundtrip tied "$W/hf_tied" --dtype fp16

# --- (c) generate on the imported-then-trained checkpoint -------------------------------------------
timeout 120 "$TPTRAIN" export --checkpoint "$W/ck_one" --output "$W/out_one" > "$W/export_one.log" 2>&1 &&
  grep -q '"torch_dtype": "float32"' "$W/out_one/config.json" && ok "export of the fp32 run: float32 by default" ||
  { bad "export of the trained checkpoint"; cat "$W/export_one.log"; }
greedy_check "generate on the imported-then-trained checkpoint" "$W/ck_one" "$W/out_one" 40

# --- (d) bad input: exit 2, naming the problem ----------------------------------------------------------
bad_copy() { rm -rf "$W/$1"; cp -r "$W/hf" "$W/$1"; }
ONE=(timeout 60 "$TPTRAIN" --config "$W/cfg.yaml" --set training.train_iters=1)
bad_copy no_shard; rm "$W/no_shard/model-00002-of-00003.safetensors"
expect2 "a missing shard" "names shard 'model-00002-of-00003.safetensors'" "${ONE[@]}" --set model.init_from="$W/no_shard"
bad_copy shape; sed -i 's/"intermediate_size": 96/"intermediate_size": 128/' "$W/shape/config.json"
expect2 "a shape that disagrees with config.json" \
  "tensor 'model.layers.0.mlp.down_proj.weight' has shape [64, 96], but config.json implies [64, 128]" \
  "${ONE[@]}" --set model.init_from="$W/shape" --set model.ffn_hidden_size=128
expect2 "config.json against the model config" "intermediate_size is 96 but model.ffn_hidden_size is 128" \
  "${ONE[@]}" --set model.ffn_hidden_size=128
bad_copy huge; sed -i 's/"vocab_size": 257/"vocab_size": 18446744073709551615/' "$W/huge/config.json"
expect2 "a vocab_size of 2^64 - 1 in config.json" "vocab_size is 18446744073709551615, larger than any model's" \
  "${ONE[@]}" --set model.init_from="$W/huge"
expect2 "rope scaling against the model config" "but model.rope_scaling is null" "${ONE[@]}" --set model.rope_scaling=null
bad_copy arch; sed -i -e 's/LlamaForCausalLM/MistralForCausalLM/' -e 's/"model_type": "llama"/"model_type": "mistral"/' \
  "$W/arch/config.json"
expect2 "an unknown architecture" 'unknown architecture (architectures ["MistralForCausalLM"]' \
  "${ONE[@]}" --set model.init_from="$W/arch"
bad_copy twice
$PY - "$W/twice/model.safetensors.index.json" <<'PY'
import sys
p = sys.argv[1]
lines = open(p).read().split("\n")
i = next(k for k, l in enumerate(lines) if '"model.norm.weight"' in l)
lines.insert(i, lines[i].rstrip(",").replace("model-00003-of", "model-00001-of") + ",")  # named again, another shard
open(p, "w").write("\n".join(lines))
PY
expect2 "an index naming a tensor twice" "weight_map names tensor 'model.norm.weight' twice" \
  "${ONE[@]}" --set model.init_from="$W/twice/model.safetensors.index.json"
# shard names confined to the folder: '..' (to a copy that holds the right tensors) and an absolute
# name that exists are refused by name; the model config is not what fails
bad_copy escape; cp "$W/escape/model-00002-of-00003.safetensors" "$W/escaped.safetensors"
sed -i 's|"model-00002-of-00003.safetensors"|"../escaped.safetensors"|' "$W/escape/model.safetensors.index.json"
expect2 "a shard name with '..'" "names shard '../escaped.safetensors' has a '..' component" \
  "${ONE[@]}" --set model.init_from="$W/escape"
sed -i "s|\"../escaped.safetensors\"|\"$W/escaped.safetensors\"|" "$W/escape/model.safetensors.index.json"
expect2 "an absolute shard name that exists" "names shard '$W/escaped.safetensors' is an absolute path" \
  "${ONE[@]}" --set model.init_from="$W/escape"
expect2 "a GPT-2 config on a Llama checkpoint" "Llama's norms are RMSNorm but model.normalization is LayerNorm" \
  "${ONE[@]}" --set model.normalization=LayerNorm
expect2 "export --dtype" "--dtype must be bf16, fp16 or fp32, got 'fp8'" \
  timeout 60 "$TPTRAIN" export --checkpoint "$W/ck_one" --output "$W/x" --dtype fp8
expect2 "export --max-shard-size" "--max-shard-size: '5XB' is not a size" \
  timeout 60 "$TPTRAIN" export --checkpoint "$W/ck_one" --output "$W/x" --max-shard-size 5XB
# an export that fails in its last shard (model.norm.weight = 1e5 overflows fp16) leaves the folder of an
# earlier export as it was: no file of it changed, removed or added, no staging folder left
bad_copy big
$PY - "$W/big" <<'PY'
import json, struct, sys
d = sys.argv[1]
shard = json.load(open(d + "/model.safetensors.index.json"))["weight_map"]["model.norm.weight"]
raw = bytearray(open(f"{d}/{shard}", "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
info = json.loads(raw[8:8 + n])["model.norm.weight"]
assert info["dtype"] == "BF16", info
raw[8 + n + info["data_offsets"][0]:8 + n + info["data_offsets"][0] + 2] = struct.pack("<H", 0x47C3)  # 99840
open(f"{d}/{shard}", "wb").write(raw)
PY
if tptrain big 1 --set model.init_from="$W/big" --set training.train_iters=1 --set optimizer.lr=0 --set optimizer.min_lr=0 \
     --set checkpoint.save="$W/ck_big" &&
   timeout 60 "$TPTRAIN" export --checkpoint "$W/ck_one" --output "$W/kept" --dtype fp16 --max-shard-size 20KB > "$W/kept.log" 2>&1; then
  before=$(cd "$W/kept" && ls -A | sort | xargs sha256sum)
  expect2 "an export overflowing fp16 in its last shard" "tensor 'model.norm.weight': max |w| 99840 overflows F16" \
    timeout 60 "$TPTRAIN" export --checkpoint "$W/ck_big" --output "$W/kept" --dtype fp16 --max-shard-size 20KB
  after=$(cd "$W/kept" && ls -A | sort | xargs sha256sum)
  if [ "$before" = "$after" ] && [ "$(ls "$W/kept" | wc -l)" -gt 3 ]; then ok "the earlier export's $(ls "$W/kept" | wc -l) files are as they were"
  else bad "the failed export changed the folder"; diff <(echo "$before") <(echo "$after") | head; fi
else bad "the overflow case's inputs"; tail -3 "$W/big.log" "$W/kept.log"; fi

finish
