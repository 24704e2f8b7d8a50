#!/usr/bin/python3
"""Writes a random Hugging Face MixtralForCausalLM, Qwen2MoeForCausalLM or Qwen3MoeForCausalLM checkpoint directory
(config.json, model.safetensors or shards + model.safetensors.index.json; transformers' names).

  make_hf_moe.py --arch mixtral|qwen2_moe|qwen3_moe --out DIR --layers 2 --hidden 64 --heads 4 --kv-heads 2 \
                 --ffn 96 --experts 4 --topk 2 --expert-ffn 48 [--shared-ffn 64] [--sparse-step N] \
                 [--mlp-only-layers 0,2] [--norm-topk-prob] [--vocab 257] [--positions 64] \
                 [--rope-theta 10000] [--dtype bf16|f16|f32] [--shards N] [--std 0.15] [--seed 1]

The attention, norms and embeddings as make_hf_llama.py writes them (no biases; Qwen2-MoE: q/k/v
biases, qkv_bias true). Mixtral: model.layers.i.block_sparse_moe.gate [E, C], .experts.j.w1 / w3
[Fe, C], w2 [C, Fe], intermediate_size = Fe. Qwen2-MoE: layer i sparse when not in mlp_only_layers
and (i + 1) % decoder_sparse_step == 0: mlp.gate, mlp.experts.j.gate_proj / up_proj / down_proj,
mlp.shared_expert.* of width --shared-ffn and mlp.shared_expert_gate [1, C]; else a dense
mlp.gate_proj / up_proj / down_proj of width --ffn (intermediate_size). Qwen3-MoE: as Qwen2-MoE
without the shared expert and the biases, with self_attn.q_norm / k_norm [D] (1 + noise).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_llama import TORCH_DTYPE, make_llama, write_checkpoint  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=["mixtral", "qwen2_moe", "qwen3_moe"], required=True)
    p.add_argument("--out", required=True)
    for k in ("layers", "hidden", "heads", "kv-heads", "ffn", "experts", "topk", "expert-ffn"):
        p.add_argument("--" + k, type=int, required=True)
    p.add_argument("--shared-ffn", type=int, default=0)
    p.add_argument("--sparse-step", type=int, default=1)
    p.add_argument("--mlp-only-layers", default="")
    p.add_argument("--norm-topk-prob", action="store_true")
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--positions", type=int, default=64)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="bf16")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--std", type=float, default=0.15)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    L, C, H, KV, E, Fe, Fs = a.layers, a.hidden, a.heads, a.kv_heads, a.experts, a.expert_ffn, a.shared_ffn
    D = C // H
    mixtral = a.arch == "mixtral"
    dense_only = [int(x) for x in a.mlp_only_layers.split(",") if x]
    sparse = [mixtral or (i not in dense_only and (i + 1) % a.sparse_step == 0) for i in range(L)]
    t = make_llama(L, C, H, KV, D, a.ffn, a.vocab, a.std, False, False, a.seed, a.rope_theta)
    rng = np.random.default_rng(a.seed + 1000)

    def normal(shape, s):
        return rng.normal(0.0, s, size=shape).astype(np.float32)

    out, out_std = {}, a.std / np.sqrt(2.0 * L)
    for name, v in t.items():  # in order; each sparse layer's dense MLP replaced by the MoE block
        i = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        if i >= 0 and sparse[i] and ".mlp." in name:
            if not name.endswith("mlp.down_proj.weight"):
                continue
            pre = f"model.layers.{i}." + ("block_sparse_moe." if mixtral else "mlp.")
            out[pre + "gate.weight"] = normal((E, C), 4 * a.std)  # decisive routing
            n = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
            for e in range(E):
                out[pre + f"experts.{e}.{n[0]}.weight"] = normal((Fe, C), a.std)
                out[pre + f"experts.{e}.{n[1]}.weight"] = normal((Fe, C), a.std)
                out[pre + f"experts.{e}.{n[2]}.weight"] = normal((C, Fe), out_std)
            if a.arch == "qwen2_moe":
                out[pre + "shared_expert.gate_proj.weight"] = normal((Fs, C), a.std)
                out[pre + "shared_expert.up_proj.weight"] = normal((Fs, C), a.std)
                out[pre + "shared_expert.down_proj.weight"] = normal((C, Fs), out_std)
                out[pre + "shared_expert_gate.weight"] = normal((1, C), a.std)
            continue
        out[name] = v
        if a.arch == "qwen3_moe" and name.endswith("self_attn.o_proj.weight"):  # q/k RMSNorm weights
            for k in ("q_norm", "k_norm"):
                out[name[:-len("o_proj.weight")] + k + ".weight"] = (1.0 + normal((D,), 0.2)).astype(np.float32)
        if a.arch == "qwen2_moe" and name.endswith("self_attn.v_proj.weight"):  # q/k/v biases (qkv_bias)
            h = name[:-len("v_proj.weight")]
            for k, rows in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)):
                out[h + k + ".bias"] = normal((rows,), 0.05)
    arch = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
    cfg = {"architectures": [arch[a.arch]], "model_type": a.arch,
           "vocab_size": a.vocab, "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": KV, "head_dim": D, "hidden_act": "silu", "max_position_embeddings": a.positions,
           "initializer_range": 0.02, "rms_norm_eps": a.eps, "rope_theta": a.rope_theta, "attention_dropout": 0.0,
           "tie_word_embeddings": False, "num_experts_per_tok": a.topk, "router_aux_loss_coef": 0.001,
           "output_router_logits": False, "bos_token_id": a.vocab - 1, "eos_token_id": a.vocab - 1,
           "use_cache": True, "torch_dtype": TORCH_DTYPE[a.dtype], "transformers_version": "4.46.0"}
    if mixtral:
        cfg.update(intermediate_size=Fe, num_local_experts=E, router_jitter_noise=0.0, sliding_window=None)
    else:
        cfg.update(intermediate_size=a.ffn, num_experts=E, moe_intermediate_size=Fe, decoder_sparse_step=a.sparse_step,
                   mlp_only_layers=dense_only, norm_topk_prob=a.norm_topk_prob, use_sliding_window=False,
                   sliding_window=4096)
        cfg.update(dict(shared_expert_intermediate_size=Fs, max_window_layers=L, qkv_bias=True)
                   if a.arch == "qwen2_moe" else dict(attention_bias=False))
    files = write_checkpoint(a.out, out, cfg, a.dtype, a.shards)
    n = sum(v.size for v in out.values())
    print(f"make_hf_moe: {a.out}: {cfg['architectures'][0]}, {len(out)} tensors ({n / 1e6:.3f}M parameters, "
          f"{a.dtype}) in {len(files)} file(s); MoE layers {[i for i in range(L) if sparse[i]]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
