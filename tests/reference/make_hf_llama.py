#!/usr/bin/python3
"""Writes a random Hugging Face LlamaForCausalLM checkpoint directory: config.json and model.safetensors,
or several shards model-0000i-of-0000n.safetensors with model.safetensors.index.json (HF's names).

  make_hf_llama.py --out DIR --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 24 --ffn 96 \
                   --vocab 257 [--positions 64] [--eps 1e-5] [--rope-theta 10000] \
                   [--rope-scaling FACTOR,LOW,HIGH,ORIG] [--rope-parameters] [--tied] [--bias] \
                   [--dtype bf16|f16|f32] [--shards N] [--inv-freq] [--std 0.05] [--seed 1]

Tensors as transformers names and lays them out: model.embed_tokens.weight [V, C],
model.layers.i.{input_layernorm, post_attention_layernorm}.weight [C], self_attn.q_proj [H*D, C],
k_proj / v_proj [KV*D, C], o_proj [C, H*D], mlp.gate_proj / up_proj [F, C], down_proj [C, F], model.norm.weight,
lm_head.weight [V, C] (absent with --tied); with --bias the q/k/v/o and gate/up/down biases
(attention_bias and mlp_bias). q and k rows in HF's rotate-half RoPE order. Norm weights are 1 + noise,
biases noise, so that a layout or permutation mistake changes the loss. --rope-parameters writes
transformers 5's rope_parameters {rope_type, rope_theta, ...} instead of rope_theta / rope_scaling;
--inv-freq adds the model.layers.i.self_attn.rotary_emb.inv_freq buffers old checkpoints carry (fp32).
--shards N splits the tensors, in order, into N shards of about equal size.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_weights import write_safetensors  # noqa: E402

TORCH_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def make_llama(L, C, H, KV, D, F, V, std=0.05, tied=False, bias=False, seed=1, rope_theta=10000.0,
               inv_freq=False):
    """Random tensors in transformers' order (float32 numpy arrays)."""
    rng = np.random.default_rng(seed)

    def normal(shape, s):
        return rng.normal(0.0, s, size=shape).astype(np.float32)

    t = {"model.embed_tokens.weight": normal((V, C), std)}
    out_std = std / np.sqrt(2.0 * L)
    for i in range(L):
        h = f"model.layers.{i}."
        t[h + "input_layernorm.weight"] = (1.0 + normal((C,), 0.2)).astype(np.float32)
        for name, rows in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)):
            t[h + f"self_attn.{name}.weight"] = normal((rows, C), std)
            if bias:
                t[h + f"self_attn.{name}.bias"] = normal((rows,), 0.05)
        t[h + "self_attn.o_proj.weight"] = normal((C, H * D), out_std)
        if bias:
            t[h + "self_attn.o_proj.bias"] = normal((C,), 0.02)
        if inv_freq:
            t[h + "self_attn.rotary_emb.inv_freq"] = (
                rope_theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)).astype(np.float32)
        t[h + "post_attention_layernorm.weight"] = (1.0 + normal((C,), 0.2)).astype(np.float32)
        t[h + "mlp.gate_proj.weight"] = normal((F, C), std)
        t[h + "mlp.up_proj.weight"] = normal((F, C), std)
        t[h + "mlp.down_proj.weight"] = normal((C, F), out_std)
        if bias:
            t[h + "mlp.gate_proj.bias"] = normal((F,), 0.05)
            t[h + "mlp.up_proj.bias"] = normal((F,), 0.05)
            t[h + "mlp.down_proj.bias"] = normal((C,), 0.02)
    t["model.norm.weight"] = (1.0 + normal((C,), 0.2)).astype(np.float32)
    if not tied:
        t["lm_head.weight"] = normal((V, C), std)
    return t


def write_checkpoint(out, tensors, config, dtype, shards=1):
    """config.json, then model.safetensors or `shards` shards + model.safetensors.index.json.
    inv_freq buffers stay fp32 (as torch saved them)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    dtypes = {n: "f32" for n in tensors if n.endswith("rotary_emb.inv_freq")}
    names = list(tensors)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), tensors, dtype, dtypes)
        return ["model.safetensors"]
    nbytes = [tensors[n].size for n in names]
    total, bounds, acc = sum(nbytes), [], 0
    for i, b in enumerate(nbytes):  # cut after the tensor that passes k/shards of the total
        acc += b
        if len(bounds) < shards - 1 and acc >= total * (len(bounds) + 1) / shards and i < len(names) - 1:
            bounds.append(i + 1)
    parts = [names[a:b] for a, b in zip([0] + bounds, bounds + [len(names)])]
    files, weight_map, size = [], {}, 0
    item = {"f32": 4, "bf16": 2, "f16": 2}
    for k, part in enumerate(parts):
        fname = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
        write_safetensors(os.path.join(out, fname), {n: tensors[n] for n in part}, dtype, dtypes)
        files.append(fname)
        for n in part:
            weight_map[n] = fname
            size += tensors[n].size * item[dtypes.get(n, dtype)]
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    return files


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--ffn", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--positions", type=int, default=64)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--rope-scaling", help="FACTOR,LOW_FREQ_FACTOR,HIGH_FREQ_FACTOR,ORIGINAL_MAX_POSITIONS (llama3)")
    p.add_argument("--rope-parameters", action="store_true")
    p.add_argument("--tied", action="store_true")
    p.add_argument("--bias", action="store_true")
    p.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="bf16")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--inv-freq", action="store_true")
    p.add_argument("--std", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    D = a.head_dim or a.hidden // a.heads
    t = make_llama(a.layers, a.hidden, a.heads, a.kv_heads, D, a.ffn, a.vocab, a.std, a.tied, a.bias, a.seed,
                   a.rope_theta, a.inv_freq)
    scaling = None
    if a.rope_scaling:
        f, lo, hi, orig = a.rope_scaling.split(",")
        scaling = {"rope_type": "llama3", "factor": float(f), "low_freq_factor": float(lo),
                   "high_freq_factor": float(hi), "original_max_position_embeddings": int(orig)}
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": a.vocab,
           "hidden_size": a.hidden, "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": D, "hidden_act": "silu",
           "max_position_embeddings": a.positions, "initializer_range": 0.02, "rms_norm_eps": a.eps,
           "attention_bias": a.bias, "attention_dropout": 0.0, "mlp_bias": a.bias, "tie_word_embeddings": a.tied,
           "bos_token_id": a.vocab - 1, "eos_token_id": a.vocab - 1, "pretraining_tp": 1, "use_cache": True,
           "torch_dtype": TORCH_DTYPE[a.dtype], "transformers_version": "4.46.0"}
    if a.rope_parameters:
        cfg["rope_parameters"] = dict(scaling or {"rope_type": "default"}, rope_theta=a.rope_theta)
    else:
        cfg["rope_theta"] = a.rope_theta
        cfg["rope_scaling"] = scaling
    files = write_checkpoint(a.out, t, cfg, a.dtype, a.shards)
    n = sum(v.size for k, v in t.items() if not k.endswith("inv_freq"))
    print(f"make_hf_llama: {a.out}: {len(t)} tensors ({n / 1e6:.3f}M parameters, {a.dtype}) in {len(files)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
