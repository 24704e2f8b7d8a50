"""Hugging Face Mixture-of-Experts checkpoints (MixtralForCausalLM, Qwen2MoeForCausalLM,
Qwen3MoeForCausalLM) for the PyTorch reference, written from transformers' published
modeling_mixtral.py / modeling_qwen2_moe.py / modeling_qwen3_moe.py and their configuration_*.py
defaults, not from tptrain's code:

  - model_config(cfg): the reference model config (tptrain's keys) config.json describes;
  - to_state(cfg, tensors, m): the reference model's parameters (model_ref.py / moe_ref.py names);
  - HFMoEModel(cfg, tensors): HF's forward itself (RMSNorm, rotate-half RoPE, GQA, the sparse MoE
    block as transformers computes it: softmax over all experts, top-k, renormalised when Mixtral or
    norm_topk_prob, every expert's SwiGLU MLP, Qwen2-MoE's shared expert times sigmoid(gate(x))) --
    an implementation independent of model_ref.py, for greedy.py on an exported directory.

HF names: Mixtral's model.layers.i.block_sparse_moe.gate [E, C] and .experts.j.w1 (gate) / w3 (up)
[Fe, C], w2 [C, Fe]; Qwen2-MoE's model.layers.i.mlp.gate, .experts.j.gate_proj / up_proj / down_proj,
.shared_expert.{gate,up,down}_proj, .shared_expert_gate [1, C]; a Qwen layer is sparse when it is not
in mlp_only_layers and (i + 1) % decoder_sparse_step == 0, else a dense mlp.gate_proj / up_proj /
down_proj of intermediate_size. Qwen2-MoE's q/k/v_proj have biases (qkv_bias, default true), o_proj
none. Qwen3-MoE: no shared expert, no biases (attention_bias false), self_attn.q_norm / k_norm [D]:
RMSNorm (rms_norm_eps) of each q / k head before RoPE (model.qk_layernorm).
"""
import json
import os

import numpy as np
import torch

import hf_llama_ref

ARCHS = {"MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe"}
# transformers' defaults: MixtralConfig / Qwen2MoeConfig
DEFAULTS = {
    "mixtral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1e6,
                    num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False),
    "qwen2_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=16, rms_norm_eps=1e-6, rope_theta=1e4,
                      num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                      shared_expert_intermediate_size=5632, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[], qkv_bias=True, tie_word_embeddings=False),
    "qwen3_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                      num_attention_heads=32, num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1e4,
                      num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=False,
                      decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False, tie_word_embeddings=False),
}
HFError = hf_llama_ref.HFLlamaError


def family(path):
    """'mixtral', 'qwen2_moe', 'qwen3_moe' or None for what config.json (of a directory, index, file) names."""
    cfg = hf_llama_ref._config_path(path)
    if not os.path.isfile(cfg):
        return None
    c = json.load(open(cfg))
    for a in c.get("architectures") or []:
        if a in ARCHS:
            return ARCHS[a]
    return c.get("model_type") if not c.get("architectures") and c.get("model_type") in ARCHS.values() else None


def is_hf_moe(path):
    return family(path) is not None


def _get(cfg, fam):
    d = DEFAULTS[fam]
    if fam == "qwen3_moe" and cfg.get("attention_bias"):
        raise HFError("Qwen3-MoE with attention_bias: not in the reference")
    return lambda k: cfg[k] if cfg.get(k) is not None else d.get(k)


def sparse_layers(cfg, fam):
    g = _get(cfg, fam)
    L = g("num_hidden_layers")
    if fam == "mixtral":
        return [1] * L
    return [int(i not in g("mlp_only_layers") and (i + 1) % g("decoder_sparse_step") == 0) for i in range(L)]


def model_config(cfg):
    fam = family_of(cfg)
    g = _get(cfg, fam)
    if fam == "mixtral" and (cfg.get("router_jitter_noise") or 0) != 0:
        raise HFError("router_jitter_noise must be 0")
    H, KV = g("num_attention_heads"), g("num_key_value_heads") or g("num_attention_heads")
    mixtral = fam == "mixtral"
    m = {"num_layers": g("num_hidden_layers"), "hidden_size": g("hidden_size"), "num_attention_heads": H,
         "ffn_hidden_size": g("intermediate_size"), "vocab_size": g("vocab_size"),
         "max_position_embeddings": cfg["max_position_embeddings"], "layernorm_epsilon": g("rms_norm_eps"),
         "normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope",
         "rotary_base": float(g("rope_theta")), "rotary_percent": 1.0, "rotary_interleaved": False, "rope_scaling": None,
         "group_query_attention": KV != H, "num_query_groups": KV if KV != H else None,
         "kv_channels": cfg.get("head_dim") or g("hidden_size") // H,
         "untie_embeddings_and_output_weights": not g("tie_word_embeddings"),
         "add_bias_linear": False, "add_qkv_bias": bool(fam == "qwen2_moe" and g("qkv_bias")),
         "num_moe_experts": g("num_local_experts" if mixtral else "num_experts"),
         "moe_router_topk": g("num_experts_per_tok"),
         "moe_ffn_hidden_size": g("intermediate_size" if mixtral else "moe_intermediate_size"),
         # HF renormalises the top-k of softmax(all) = Megatron's softmax over the top-k logits
         "moe_router_pre_softmax": not (mixtral or g("norm_topk_prob")),
         "moe_layer_freq": sparse_layers(cfg, fam),
         "moe_shared_expert_intermediate_size": g("shared_expert_intermediate_size") if fam == "qwen2_moe" else None,
         "moe_shared_expert_gate": fam == "qwen2_moe", "qk_layernorm": fam == "qwen3_moe"}
    return m


def family_of(cfg):
    for a in cfg.get("architectures") or []:
        if a in ARCHS:
            return ARCHS[a]
    if cfg.get("model_type") in ARCHS.values():
        return cfg["model_type"]
    raise HFError(f"not an MoE config.json: {cfg.get('architectures')}")


# tptrain's defaults of the keys a model config may leave out
TPT_DEFAULTS = {"normalization": "LayerNorm", "swiglu": False, "position_embedding_type": "learned_absolute",
                "rotary_base": 10000.0, "rotary_percent": 1.0, "rotary_interleaved": False, "rope_scaling": None,
                "group_query_attention": False, "num_query_groups": None, "add_bias_linear": True,
                "add_qkv_bias": False, "untie_embeddings_and_output_weights": False, "moe_router_topk": 2,
                "moe_router_pre_softmax": False, "moe_layer_freq": 1, "moe_shared_expert_intermediate_size": None,
                "moe_shared_expert_gate": False, "qk_layernorm": False}


def check_model(cfg, m):
    want = model_config(cfg)
    for k in ("moe_router_score_function", "moe_router_topk_scaling_factor", "moe_router_num_groups",
              "moe_router_enable_expert_bias"):
        if m.get(k) not in (None, False, "softmax"):
            raise HFError(f"model.{k} = {m[k]!r}: HF's router has no such option")
    for k, w in want.items():
        v = m.get(k) if m.get(k) is not None else TPT_DEFAULTS.get(k)
        if k == "kv_channels" and v is None:
            v = m["hidden_size"] // m["num_attention_heads"]
        if k == "rotary_base":
            v = float(v)
        if k == "moe_layer_freq":
            L = m["num_layers"]
            v = v if isinstance(v, list) else [int(i % (v or 1) == 0) for i in range(L)]
        if k == "max_position_embeddings" or (k == "ffn_hidden_size" and all(want["moe_layer_freq"])):
            continue  # fewer positions may be used; no dense MLP when every layer is MoE
        if k == "moe_ffn_hidden_size" and v is None:
            v = m["ffn_hidden_size"]
        if bool(v) != bool(w) if isinstance(w, bool) else v != w:
            raise HFError(f"config.json gives {k} = {w!r}, the config {v!r}")


def to_state(cfg, tensors, m):
    fam = family_of(cfg)
    sparse = sparse_layers(cfg, fam)
    C, E = m["hidden_size"], m["num_moe_experts"]
    Fe = m.get("moe_ffn_hidden_size") or m["ffn_hidden_size"]
    Fs = m.get("moe_shared_expert_intermediate_size")
    names = ("w1", "w3", "w2") if fam == "mixtral" else ("gate_proj", "up_proj", "down_proj")

    D = m.get("kv_channels") or C // m["num_attention_heads"]

    def layer_mlp(i, take, st):
        if fam == "qwen3_moe":  # the q/k norms (HF's channel order = rotate-half, the config's)
            for w in ("q", "k"):
                st[f"h.{i}.attn.{w}_layernorm.weight"] = take(f"model.layers.{i}.self_attn.{w}_norm.weight", [D])
        if not sparse[i]:
            return False
        p = f"model.layers.{i}." + ("block_sparse_moe." if fam == "mixtral" else "mlp.")
        o = f"h.{i}.mlp."
        st[o + "router.weight"] = take(p + "gate.weight", [E, C])
        ex = [[take(p + f"experts.{e}.{n}.weight", [Fe, C] if j < 2 else [C, Fe]) for j, n in enumerate(names)]
              for e in range(E)]
        st[o + "experts.fc1.weight"] = np.stack([np.concatenate([g, u]) for g, u, _ in ex])
        st[o + "experts.fc2.weight"] = np.stack([d for _, _, d in ex])
        if Fs:
            s = p + "shared_expert."
            st[o + "shared_experts.fc1.weight"] = np.concatenate([take(s + "gate_proj.weight", [Fs, C]),
                                                                  take(s + "up_proj.weight", [Fs, C])])
            st[o + "shared_experts.fc2.weight"] = take(s + "down_proj.weight", [C, Fs])
            st[o + "shared_experts.gate.weight"] = take(p + "shared_expert_gate.weight", [1, C])
        return True

    return hf_llama_ref.to_state(cfg, tensors, m, check=check_model, layer_mlp=layer_mlp)


class HFMoEModel:
    """transformers' MixtralForCausalLM / Qwen2MoeForCausalLM forward (eval, no cache, full causal
    attention) on float64 copies of the HF tensors: model(tokens (1, T)) -> logits (1, T, V)."""

    def __init__(self, cfg, tensors, dtype=torch.float64):
        self.fam = family_of(cfg)
        g = _get(cfg, self.fam)
        self.g, self.sparse = g, sparse_layers(cfg, self.fam)
        self.t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in tensors.items()}
        self.H = g("num_attention_heads")
        self.KV = g("num_key_value_heads") or self.H
        self.D = cfg.get("head_dim") or g("hidden_size") // self.H
        self.eps, self.theta = g("rms_norm_eps"), float(g("rope_theta"))
        self.k = g("num_experts_per_tok")
        self.norm_topk = self.fam == "mixtral" or bool(g("norm_topk_prob"))
        self.E = g("num_local_experts" if self.fam == "mixtral" else "num_experts")
        self.dtype = dtype

    def eval(self):
        return self

    def rms(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def lin(self, x, name, bias=False):
        y = x @ self.t[name + ".weight"].t()
        return y + self.t[name + ".bias"] if bias else y

    def mlp(self, x, p):
        return self.lin(torch.nn.functional.silu(self.lin(x, p + "gate_proj")) * self.lin(x, p + "up_proj"),
                        p + "down_proj")

    def moe(self, x, p):  # the sparse block: x (N, C)
        logits = self.lin(x, p + "gate")
        w = torch.softmax(logits, dim=-1, dtype=torch.float64)
        w, sel = torch.topk(w, self.k, dim=-1)
        if self.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        n = ("w1", "w3", "w2") if self.fam == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for e in range(self.E):
            rows, slot = torch.where(sel == e)
            if len(rows) == 0:
                continue
            q = p + f"experts.{e}."
            xe = x[rows]
            y = self.lin(torch.nn.functional.silu(self.lin(xe, q + n[0])) * self.lin(xe, q + n[1]), q + n[2])
            out.index_add_(0, rows, y * w[rows, slot, None].to(x.dtype))
        if self.fam == "qwen2_moe":
            out = out + torch.sigmoid(self.lin(x, p + "shared_expert_gate")) * self.mlp(x, p + "shared_expert.")
        return out

    def __call__(self, idx):
        T = idx.shape[1]
        H, KV, D = self.H, self.KV, self.D
        x = self.t["model.embed_tokens.weight"][idx[0]]
        inv = 1.0 / (self.theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
        cos, sin = torch.cat([ang, ang], -1).cos().to(self.dtype), torch.cat([ang, ang], -1).sin().to(self.dtype)
        rot = lambda a: torch.cat([-a[..., D // 2:], a[..., :D // 2]], -1)  # noqa: E731  rotate_half
        bias = self.fam == "qwen2_moe" and bool(self.g("qkv_bias"))
        mask = torch.full((T, T), float("-inf"), dtype=self.dtype).triu(1)
        for i in range(self.g("num_hidden_layers")):
            h = f"model.layers.{i}."
            a = self.rms(x, self.t[h + "input_layernorm.weight"])
            q = self.lin(a, h + "self_attn.q_proj", bias).view(T, H, D).transpose(0, 1)
            k = self.lin(a, h + "self_attn.k_proj", bias).view(T, KV, D).transpose(0, 1)
            if self.fam == "qwen3_moe":  # Qwen3MoeRMSNorm of each head, before RoPE
                q = self.rms(q, self.t[h + "self_attn.q_norm.weight"])
                k = self.rms(k, self.t[h + "self_attn.k_norm.weight"])
            v = self.lin(a, h + "self_attn.v_proj", bias).view(T, KV, D).transpose(0, 1)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            k, v = k.repeat_interleave(H // KV, 0), v.repeat_interleave(H // KV, 0)  # repeat_kv
            att = torch.softmax(q @ k.transpose(1, 2) / D ** 0.5 + mask, dim=-1) @ v
            x = x + self.lin(att.transpose(0, 1).reshape(T, H * D), h + "self_attn.o_proj")
            a = self.rms(x, self.t[h + "post_attention_layernorm.weight"])
            if self.sparse[i]:
                x = x + self.moe(a, h + ("block_sparse_moe." if self.fam == "mixtral" else "mlp."))
            else:
                x = x + self.mlp(a, h + "mlp.")
        x = self.rms(x, self.t["model.norm.weight"])
        head = self.t.get("lm_head.weight", self.t["model.embed_tokens.weight"])
        return (x @ head.t())[None]
