#!/usr/bin/env bash
# tptrain export (docs/ARCHITECTURE.md "Command line and exit status"): a TP2 x PP2 checkpoint -> Hugging Face GPT-2
# model.safetensors + config.json. Checks: the file's names, shapes and values against the
# checkpoint's shards (the inverse of interop/hf/gpt2.cpp), config.json's keys, and the loss of one
# step from the exported weights in the PyTorch reference (tests/reference/gpt_ref.py) and in
# tptrain (model.init_from) -- equal within 1e-5 relative -- and, as a round trip, tptrain from the
# exported file reproduces exactly the loss of tptrain resumed from the checkpoint on the same batch.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 385 --docs 7 --pattern markov --seed 1 \
  --megatron "$W/tokens" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
# 385 tokens = 24 samples of 16 + 1 = 3 global batches of 8: iteration 4 visits the samples of
# iteration 1 again (shuffle off). Every key the reference needs explicitly; vocabulary 97 padded (to 128 at TP2) and an ffn size
# that is not 4 * hidden, so that padding and the n_inner mapping are exercised.
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, ffn_hidden_size: 192, seq_length: 16,
        max_position_embeddings: 16, vocab_size: 97, make_vocab_size_divisible_by: 64, layernorm_epsilon: 1.0e-5}
training: {micro_batch_size: 4, global_batch_size: 8, train_iters: 3, precision: fp32, seed: 11, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 1, lr_decay_style: cosine, lr_decay_iters: 10,
            weight_decay: 0.1, adam_beta1: 0.9, adam_beta2: 0.95, adam_eps: 1.0e-8, clip_grad: 1.0}
data: {path: $W/tokens, shuffle: false, split: [1, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML

# 3 iterations at TP2 x PP2 (x DP1), saved
if timeout 120 mpirun -np 4 "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.tensor_model_parallel_size=2 \
    --set parallel.pipeline_model_parallel_size=2 --set checkpoint.save="$W/ck" > "$W/train.log" 2>&1; then
  ok "train 3 iterations at TP2xPP2, saved"
else bad "train at TP2xPP2"; tail -10 "$W/train.log"; fi

# export from the save directory (its latest checkpoint) and from the iter_N directory
timeout 120 "$TPTRAIN" export --checkpoint "$W/ck" --output "$W/hf" > "$W/export.log" 2>&1 &&
  ok "export --checkpoint <save dir>: $(tail -1 "$W/export.log")" || { bad "export"; cat "$W/export.log"; }
timeout 120 "$TPTRAIN" export --checkpoint "$W/ck/iter_0000003" --output "$W/hf_iter" > "$W/export_iter.log" 2>&1 &&
  cmp -s "$W/hf/model.safetensors" "$W/hf_iter/model.safetensors" && ok "export --checkpoint <iter_N dir>: the same file" ||
  { bad "export of the iter_N directory"; cat "$W/export_iter.log"; }

# names, shapes, values (against the TP/PP shards) and config.json
if $PY - "$W/hf" "$W/ck/iter_0000003" <<'PY'
import json, struct, sys
import numpy as np

def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (name, t["dtype"])
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(t["shape"])
    return out, meta

hf, meta = read_st(sys.argv[1] + "/model.safetensors")
assert meta.get("format") == "pt", meta
cfg = json.load(open(sys.argv[1] + "/config.json"))
for k, v in dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_embd=64, n_head=4, n_positions=16,
                 n_ctx=16, n_inner=192, vocab_size=97, layer_norm_epsilon=1e-5, activation_function="gelu_new").items():
    assert cfg.get(k) == v, f"config.json {k} = {cfg.get(k)!r}, want {v!r}"
C, F, V, P, L = 64, 192, 97, 16, 2
want = {"wte.weight": [V, C], "wpe.weight": [P, C], "ln_f.weight": [C], "ln_f.bias": [C]}
for i in range(L):
    h = f"h.{i}."
    want.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C], h + "ln_2.weight": [C], h + "ln_2.bias": [C],
                 h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
                 h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
                 h + "mlp.c_fc.weight": [C, F], h + "mlp.c_fc.bias": [F],
                 h + "mlp.c_proj.weight": [F, C], h + "mlp.c_proj.bias": [C]})
got = {k: list(v.shape) for k, v in hf.items()}
assert got == want, f"names/shapes differ: {sorted(set(got.items()) ^ set(want.items()))}"

# the checkpoint's tensors, assembled from the boxes of every shard via the meta.json index
ck = json.load(open(sys.argv[2] + "/meta.json"))
full = {}
for fname, entry in ck["files"].items():
    if not fname.startswith("model_"):
        continue
    shard, _ = read_st(sys.argv[2] + "/" + fname)
    for t in entry["tensors"]:
        a = full.setdefault(t["name"], np.full(t["global_shape"], np.nan, dtype=np.float32))
        a[tuple(slice(o, o + s) for o, s in zip(t["box_offset"], t["box_size"]))] = shard[t["name"]]
assert all(not np.isnan(a).any() for a in full.values()), "checkpoint boxes do not cover the tensors"
eq = lambda a, b, what: np.array_equal(a, b) or sys.exit(f"{what}: values differ")
eq(hf["wte.weight"], full["wte.weight"], "wte")
for i in range(L):
    h = f"h.{i}."
    eq(hf[h + "attn.c_attn.weight"], full[h + "attn.qkv.weight"].reshape(3 * C, C).T, "c_attn.weight")
    eq(hf[h + "attn.c_attn.bias"], full[h + "attn.qkv.bias"].reshape(3 * C), "c_attn.bias")
    eq(hf[h + "attn.c_proj.weight"], full[h + "attn.proj.weight"].T, "attn.c_proj.weight")
    eq(hf[h + "mlp.c_fc.weight"], full[h + "mlp.fc1.weight"].T, "c_fc.weight")
    eq(hf[h + "mlp.c_proj.weight"], full[h + "mlp.fc2.weight"].T, "mlp.c_proj.weight")
    eq(hf[h + "ln_2.bias"], full[h + "ln_2.bias"], "ln_2.bias")
print("  names, shapes, Conv1D layout, unpadded vocabulary and config.json as HF GPT-2 expects")
PY
then ok "model.safetensors matches the checkpoint's shards"; else bad "model.safetensors contents"; fi

# one step from the exported weights: PyTorch reference vs tptrain (init_from), at 1 rank
timeout 300 $PY "$TPTRAIN_SRC/tests/reference/gpt_ref.py" --config "$W/cfg.yaml" --init "$W/hf/model.safetensors" \
  --steps 1 --out "$W/ref.jsonl" --threads 1 > "$W/ref.log" 2>&1 || { bad "gpt_ref.py"; tail -5 "$W/ref.log"; }
timeout 120 "$TPTRAIN" --config "$W/cfg.yaml" --set model.init_from="$W/hf/model.safetensors" \
  --set training.train_iters=1 --set logging.metrics_file="$W/tpt.jsonl" > "$W/tpt.log" 2>&1 ||
  { bad "tptrain init_from the export"; tail -5 "$W/tpt.log"; }
# the checkpoint itself, resumed at 1 rank: iteration 4 = the batch of iteration 1, the same weights
timeout 120 "$TPTRAIN" --config "$W/cfg.yaml" --set checkpoint.load="$W/ck" --set training.train_iters=4 \
  --set logging.metrics_file="$W/resumed.jsonl" > "$W/resumed.log" 2>&1 || { bad "tptrain resume"; tail -5 "$W/resumed.log"; }
if out=$($PY - "$W/ref.jsonl" "$W/tpt.jsonl" "$W/resumed.jsonl" <<'PY'
import json, sys
r, t, c = (json.loads(open(p).readline()) for p in sys.argv[1:4])
assert c["iteration"] == 4, c
rel = abs(r["lm_loss"] - t["lm_loss"]) / abs(r["lm_loss"])
print(f"  lm loss: reference {r['lm_loss']:.7f}, tptrain init_from export {t['lm_loss']:.7f} (relative difference "
      f"{rel:.1e}), tptrain resumed from the checkpoint {c['lm_loss']:.7f}")
print(f"  grad norm: reference {r['grad_norm']:.6f}, init_from export {t['grad_norm']:.6f}, resumed {c['grad_norm']:.6f}")
if c["lm_loss"] != t["lm_loss"] or c["grad_norm"] != t["grad_norm"]:
    sys.exit(2)
sys.exit(0 if rel <= 1e-5 else 1)
PY
); then
  ok "loss of one step from the exported weights: PyTorch reference = tptrain (1e-5) = tptrain resumed (bitwise)"
else bad "loss from the export"; fi
echo "$out"

# bad input: exit 2 with a message
timeout 60 "$TPTRAIN" export --checkpoint "$W/nothing" --output "$W/x" > "$W/bad.log" 2>&1
[ $? -eq 2 ] && grep -q "no checkpoint in $W/nothing" "$W/bad.log" && ok "export of a directory without checkpoint: exit 2" ||
  { bad "export without checkpoint"; cat "$W/bad.log"; }
timeout 60 "$TPTRAIN" export --checkpoint "$W/ck" > "$W/bad2.log" 2>&1
[ $? -eq 2 ] && grep -q -- "--output is required" "$W/bad2.log" && ok "export without --output: exit 2" || { bad "export args"; cat "$W/bad2.log"; }

finish
