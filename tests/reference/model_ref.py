"""The model of the PyTorch reference (gpt_ref.py), written from docs/ARCHITECTURE.md "Model": GPT-2
by default (pre-LN, learned positions, GELU MLP, biases, tied LM head, no dropout) and the LLaMA
family's options (RMSNorm, SwiGLU, RoPE with Llama 3.1 scaling, grouped-query attention, untied output
layer, no linear biases, Qwen3's q/k norms: qk_layernorm, the layer's norm over each head's D channels
of q and of k after the QKV projection and before RoPE, one (D) weight for all query heads and one for
all key heads), each by hand (this torch has neither nn.RMSNorm nor GQA attention), and
the Mixture-of-Experts MLP of docs/MOE.md on the layers moe_layer_freq marks (moe_ref.py).
Parameter names are tptrain's global names; each tensor is stored as the row-major 2-D (or 1-D) view
of its global shape, e.g. attn.qkv.weight [3, H*D, C] or, grouped, [G, H/G + 2, D, C] as
((H + 2G) D, C), so tptrain's init (init_ref.py) indexes it by the flat global index."""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import moe_ref  # the Mixture-of-Experts MLP (tests/reference/moe_ref.py, docs/MOE.md)


def resolve_arch(m):
    """The architecture of a model config (a dict: the keys missing take GPT-2's defaults)."""
    get = lambda k, d: m[k] if m.get(k) is not None else d  # noqa: E731
    C, H = m["hidden_size"], m["num_attention_heads"]
    D = get("kv_channels", C // H)
    rope = get("position_embedding_type", "learned_absolute") == "rope"
    bias = get("add_bias_linear", True)
    return {"L": m["num_layers"], "C": C, "H": H, "D": D, "F": m["ffn_hidden_size"], "V": m["vocab_size"],
            "P": m["max_position_embeddings"], "eps": m["layernorm_epsilon"],
            "rms": get("normalization", "LayerNorm") == "RMSNorm", "swiglu": get("swiglu", False),
            "gqa": get("group_query_attention", False),
            "G": m["num_query_groups"] if get("group_query_attention", False) else H,
            "rope": rope, "rot": int(D * get("rotary_percent", 1.0)) if rope else 0,
            "rotary_base": get("rotary_base", 10000.0), "interleaved": get("rotary_interleaved", False),
            "rope_scaling": m.get("rope_scaling"),
            "tied": not get("untie_embeddings_and_output_weights", False),
            "bias": bias, "qkv_bias": bias or get("add_qkv_bias", False), "qk_norm": get("qk_layernorm", False),
            "moe": moe_ref.resolve_moe(m)}


def is_gpt2(m):
    a = resolve_arch(m)
    return (not a["rms"] and not a["swiglu"] and not a["rope"] and not a["gqa"] and a["tied"] and a["bias"]
            and a["D"] * a["H"] == a["C"] and a["moe"] is None and not a["qk_norm"])


class Norm(nn.Module):
    """LayerNorm (weight, bias), or RMSNorm y = w * x / sqrt(mean(x^2) + eps) (weight only)."""

    def __init__(self, C, eps, rms):
        super().__init__()
        self.eps, self.rms = eps, rms
        self.weight = nn.Parameter(torch.ones(C))
        if not rms:
            self.bias = nn.Parameter(torch.zeros(C))

    def forward(self, x):
        if self.rms:
            return self.weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps))
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def rope_inv_freq(rot, base, scaling=None):
    """inv_freq[j] = base^(-2j/rot), j < rot/2, in float64, with Llama 3.1's rescaling (Hugging Face's
    rope_type "llama3") when scaling is given; returned as float32."""
    inv = base ** (-2.0 * np.arange(rot // 2, dtype=np.float64) / rot)
    if scaling:
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        orig = scaling["original_max_position_embeddings"]
        wavelen = 2.0 * math.pi / inv
        scaled = np.where(wavelen > orig / low, inv / factor, inv)      # long wavelengths: / factor
        smooth = (orig / wavelen - low) / (high - low)
        medium = (wavelen >= orig / high) & (wavelen <= orig / low)     # in between: interpolated
        inv = np.where(medium, (1.0 - smooth) * scaled / factor + smooth * scaled, scaled)
    return torch.from_numpy(inv.astype(np.float32))


def rope_rotate_half(x, cos, sin):
    """Hugging Face's rotate-half: channel pairs (j, j + rot/2) of x (..., rot) by angles (..., rot/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos2, sin2 = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return x * cos2 + torch.cat([-x2, x1], -1) * sin2


def rope_complex(x, angle):
    """Meta's interleaved form: channel pairs (2j, 2j+1) of x (..., rot) as complex numbers times
    e^(i angle) (angle (..., rot/2))."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * torch.polar(torch.ones_like(angle), angle)).flatten(-2)


class Attention(nn.Module):
    """Causal self-attention, multi-head or grouped-query (query head h uses KV group h // (H/G)),
    scaled by 1/sqrt(D), with optional rotary q and k."""

    def __init__(self, a):
        super().__init__()
        self.a = a
        C, H, G, D = a["C"], a["H"], a["G"], a["D"]
        self.qkv = nn.Linear(C, (H + 2 * G) * D, bias=a["qkv_bias"])
        self.proj = nn.Linear(H * D, C, bias=a["bias"])
        if a["qk_norm"]:                              # over the last dimension (D) of every head
            self.q_layernorm = Norm(D, a["eps"], a["rms"])
            self.k_layernorm = Norm(D, a["eps"], a["rms"])

    def rotate(self, x, angle):                       # x (B, T, n, D), angle (B|1, T, 1, rot/2)
        rot = self.a["rot"]
        r = rope_complex(x[..., :rot], angle) if self.a["interleaved"] else \
            rope_rotate_half(x[..., :rot], torch.cos(angle), torch.sin(angle))
        return torch.cat([r, x[..., rot:]], -1)

    def forward(self, x, mask, angle):                # x: (B, T, C)
        B, T, _ = x.shape
        H, G, D = self.a["H"], self.a["G"], self.a["D"]
        y = self.qkv(x)                               # (B, T, (H + 2G) D)
        if self.a["gqa"]:                             # Megatron's grouped rows: per group Q heads, k, v
            y = y.view(B, T, G, H // G + 2, D)
            q = y[:, :, :, :H // G].reshape(B, T, H, D)   # head g*(H/G) + i
            k, v = y[:, :, :, H // G], y[:, :, :, H // G + 1]  # (B, T, G, D)
        else:                                         # [q of all heads; k; v]
            q, k, v = (t.reshape(B, T, H, D) for t in y.split(H * D, dim=2))
        if self.a["qk_norm"]:                         # before RoPE
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        if angle is not None:
            q, k = self.rotate(q, angle), self.rotate(k, angle)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # (B, heads, T, D)
        k = k.repeat_interleave(H // k.shape[1], dim=1)                     # (B, H, T, D)
        v = v.repeat_interleave(H // v.shape[1], dim=1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))           # (B, H, T, T)
        scores = scores.masked_fill(~mask[:T, :T], float("-inf"))
        probs = F.softmax(scores, dim=-1)
        return self.proj((probs @ v).transpose(1, 2).reshape(B, T, H * D))


class MLP(nn.Module):
    """fc2(gelu_tanh(fc1(x))), or with swiglu fc2(silu(gate) * up), [gate; up] = fc1(x)."""

    def __init__(self, a):
        super().__init__()
        self.swiglu, self.F = a["swiglu"], a["F"]
        self.fc1 = nn.Linear(a["C"], (2 if a["swiglu"] else 1) * a["F"], bias=a["bias"])
        self.fc2 = nn.Linear(a["F"], a["C"], bias=a["bias"])

    def forward(self, x):
        h = self.fc1(x)
        if self.swiglu:
            gate, up = h.split(self.F, dim=-1)
            return self.fc2(gate * torch.sigmoid(gate) * up)
        return self.fc2(F.gelu(h, approximate="tanh"))


class Block(nn.Module):
    def __init__(self, a, moe_layer=False):
        super().__init__()
        self.ln_1 = Norm(a["C"], a["eps"], a["rms"])
        self.attn = Attention(a)
        self.ln_2 = Norm(a["C"], a["eps"], a["rms"])
        self.mlp = moe_ref.MoEMLP(a, MLP) if moe_layer else MLP(a)

    def forward(self, x, mask, angle):
        x = x + self.attn(self.ln_1(x), mask, angle)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg_model):
        super().__init__()
        a = self.a = resolve_arch(cfg_model)
        self.wte = nn.Embedding(a["V"], a["C"])
        if not a["rope"]:
            self.wpe = nn.Embedding(a["P"], a["C"])
        moe_layers = a["moe"]["layers"] if a["moe"] else [False] * a["L"]
        self.h = nn.ModuleList([Block(a, moe_layers[i]) for i in range(a["L"])])
        self.ln_f = Norm(a["C"], a["eps"], a["rms"])
        if not a["tied"]:
            self.lm_head = nn.Linear(a["C"], a["V"], bias=False)
        # float32 whatever the model's dtype (not a buffer: .to(float64) would convert it)
        self.inv_freq = rope_inv_freq(a["rot"], a["rotary_base"], a["rope_scaling"]) if a["rope"] else None
        self.register_buffer("mask", torch.tril(torch.ones(a["P"], a["P"], dtype=torch.bool)), persistent=False)

    def forward(self, idx, pos=None):                     # idx: (B, T) -> logits (B, T, V)
        T = idx.shape[1]
        if pos is None:                                   # pos: (B, T) per-token positions, or 0..T-1
            pos = torch.arange(T, device=idx.device)[None]
        parts = getattr(self, "tied_parts", None)         # a dict: the tied weight's two gradients apart
        wte = self.wte.weight
        if parts is not None and self.a["tied"]:
            w_in, w_out = wte.view_as(wte), wte.view_as(wte)
            w_in.register_hook(lambda g: parts.__setitem__("embedding", g))
            w_out.register_hook(lambda g: parts.__setitem__("head", g))
        else:
            w_in = w_out = wte
        x = F.embedding(idx, w_in)                        # (B, T, C)
        angle = None
        if self.a["rope"]:                                # pos * inv_freq, in the model's dtype (fp32)
            dt = x.dtype
            angle = (pos.to(dt)[..., None] * self.inv_freq.to(dt))[:, :, None, :]  # (B|1, T, 1, rot/2)
        else:
            x = x + self.wpe(pos)
        for blk in self.h:
            x = blk(x, self.mask, angle)
        x = self.ln_f(x)
        return F.linear(x, w_out if self.a["tied"] else self.lm_head.weight)  # (B, T, V)

    def loss(self, tokens):                               # tokens: (B, S+1) -> mean CE over B*S
        logits = self(tokens[:, :-1])
        V = logits.shape[-1]
        return F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))

    def moe_layers(self):
        """The MoE MLPs (moe_ref.MoEMLP) in layer order; empty for a dense model."""
        return [blk.mlp for blk in self.h if isinstance(blk.mlp, moe_ref.MoEMLP)]

    def load_state(self, state):
        params = dict(self.named_parameters())
        if set(params) != set(state):
            raise AssertionError(f"internal: parameter names differ: {sorted(set(params) ^ set(state))[:5]}")
        with torch.no_grad():
            for n, p in params.items():
                src = torch.from_numpy(np.ascontiguousarray(state[n])).to(p.dtype)
                if src.shape != p.shape:
                    raise AssertionError(f"internal: {n} shape {tuple(src.shape)} vs {tuple(p.shape)}")
                p.copy_(src)


def build_model(cfg_model, dtype=torch.float32):
    return GPT(cfg_model).to(dtype)


def tptrain_init_state(model, cfg_model, seed):
    """tptrain's counter-based init (init_ref.py) of every parameter, by its global name."""
    from init_ref import init_tensor  # tests/reference/init_ref.py
    return {n: init_tensor(n, tuple(p.shape), seed, cfg_model["init_method_std"], cfg_model["num_layers"])
            for n, p in model.named_parameters()}


def is_decayed(name):
    """AdamW decays every weight matrix (both embeddings, lm_head, linear weights), no bias or norm."""
    return name.endswith(".weight") and not name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight",
                                                           "q_layernorm.weight", "k_layernorm.weight"))
