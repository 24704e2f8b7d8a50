"""Self-checks of the LLaMA-family reference (model_ref.py, init_ref.py): RMSNorm, SwiGLU, RoPE, GQA,
untied head, no biases, and tptrain's Philox init. Registered into selftest.py's checks on import;
run them with `selftest.py --only llama,rope,philox,tptrain_init`."""
import io
import math
import os
import shutil
import subprocess
import time
from contextlib import redirect_stderr

import numpy as np
import torch

import gpt_ref
import init_ref
import make_tokens
import model_ref
from selftest_common import LossOf, check, cli, cli_runs, tiny_cfg

HERE = os.path.dirname(os.path.abspath(__file__))


LLAMA = {"normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope",
         "group_query_attention": True, "num_query_groups": 2, "untie_embeddings_and_output_weights": True,
         "add_bias_linear": False}
# each option alone, some together, on llama_cfg's tiny model (head dim 4 unless kv_channels)
VARIANTS = {
    "gpt2": {},
    "rmsnorm": {"normalization": "RMSNorm"},
    "swiglu": {"swiglu": True},
    "rope": {"position_embedding_type": "rope"},
    "rope_interleaved_half_scaled": {"position_embedding_type": "rope", "rotary_interleaved": True,
                                     "rotary_percent": 0.5, "rotary_base": 50.0, "kv_channels": 8,
                                     "rope_scaling": {"factor": 4.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 2.0,
                                                      "original_max_position_embeddings": 8}},
    "gqa_kv8": {"group_query_attention": True, "num_query_groups": 2, "kv_channels": 8},
    "untied": {"untie_embeddings_and_output_weights": True},
    "nobias": {"add_bias_linear": False},
    "nobias_qkvbias": {"add_bias_linear": False, "add_qkv_bias": True},
    "llama": dict(LLAMA, kv_channels=6),
    "qk_layernorm": {"qk_layernorm": True, "kv_channels": 8},          # LayerNorm of q and k, with biases
    "llama_qk_layernorm": dict(LLAMA, kv_channels=6, qk_layernorm=True),  # RMSNorm of q and k (Qwen3)
}


def llama_cfg(extra, L=2, C=16, H=4, V=13, P=7, Fh=10):
    m = tiny_cfg(L=L, C=C, H=H, V=V, P=P, Fh=Fh)
    m.update(extra)
    m["init_method_std"] = 0.02
    return m


def random_state(model, seed=0, std=0.3):
    """Random float64 values for every parameter (norm weights around 1, biases nonzero)."""
    rng = np.random.default_rng(seed)
    out = {}
    for n, p in model.named_parameters():
        v = rng.normal(0.0, std, size=tuple(p.shape))
        out[n] = 1.0 + v if n.endswith(init_ref.NORM_WEIGHTS) else v
    return out


def scalar_inv_freq(rot, base, scaling):
    """inv_freq with Llama 3.1's rule, one frequency at a time (python floats), rounded to float32."""
    out = []
    for j in range(rot // 2):
        f = base ** (-2.0 * j / rot)
        if scaling:
            orig = scaling["original_max_position_embeddings"]
            lo, hi, fac = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
            wl = 2 * math.pi / f
            if wl < orig / hi:
                pass
            elif wl > orig / lo:
                f = f / fac
            else:
                sm = (orig / wl - lo) / (hi - lo)
                f = (1 - sm) * f / fac + sm * f
        out.append(float(np.float32(f)))
    return out


def numpy_model_loss(t, m, tokens, pos=None):
    """The model from tptrain's global tensors, float64 numpy, head by head and pair by pair: the QKV
    rows read as [3, H, D, C] or grouped [G, H/G + 2, D, C], fc1 as [2, F, C] with swiglu; RoPE pairs
    rotated by x0 c - x1 s, x1 c + x0 s. Mean CE."""
    C, H, L, eps = m["hidden_size"], m["num_attention_heads"], m["num_layers"], m["layernorm_epsilon"]
    D = m.get("kv_channels") or C // H
    gqa = m.get("group_query_attention", False)
    G = m["num_query_groups"] if gqa else H
    Q = H // G
    rope = m.get("position_embedding_type") == "rope"
    rms = m.get("normalization") == "RMSNorm"
    Fh = m["ffn_hidden_size"]
    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    B, T = inp.shape
    if pos is None:
        pos = np.tile(np.arange(T), (B, 1))

    def norm(x, name):
        if rms:
            return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * t[name + ".weight"]
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * t[name + ".weight"] + t[name + ".bias"]

    def bias(name, shape):
        return t[name].reshape(shape) if name in t else np.zeros(shape)

    if rope:
        rot = int(D * m.get("rotary_percent", 1.0))
        inv = scalar_inv_freq(rot, m.get("rotary_base", 10000.0), m.get("rope_scaling"))
        pairs = [((2 * j, 2 * j + 1) if m.get("rotary_interleaved") else (j, j + rot // 2)) for j in range(rot // 2)]

    def rotate(x):                                   # x (B, T, D)
        if not rope:
            return x
        x = x.copy()
        for j, (i0, i1) in enumerate(pairs):
            ang = pos * inv[j]
            c, s = np.cos(ang), np.sin(ang)
            x0, x1 = x[..., i0].copy(), x[..., i1].copy()
            x[..., i0] = x0 * c - x1 * s
            x[..., i1] = x1 * c + x0 * s
        return x

    x = t["wte.weight"][inp]
    if not rope:
        x = x + t["wpe.weight"][pos]
    causal = np.tril(np.ones((T, T), bool))
    for i in range(L):
        p = f"h.{i}."
        a = norm(x, p + "ln_1")
        if gqa:
            W = t[p + "attn.qkv.weight"].reshape(G, Q + 2, D, C)
            b = bias(p + "attn.qkv.bias", (G, Q + 2, D))
            wq = lambda h: (W[h // Q, h % Q], b[h // Q, h % Q])      # noqa: E731
            wk = lambda h: (W[h // Q, Q], b[h // Q, Q])              # noqa: E731
            wv = lambda h: (W[h // Q, Q + 1], b[h // Q, Q + 1])      # noqa: E731
        else:
            W = t[p + "attn.qkv.weight"].reshape(3, H, D, C)
            b = bias(p + "attn.qkv.bias", (3, H, D))
            wq, wk, wv = ((lambda h, s=s: (W[s, h], b[s, h])) for s in range(3))
        heads = []
        for h in range(H):
            q, k, v = (a @ w.T + bb for w, bb in (wq(h), wk(h), wv(h)))   # (B, T, D)
            if m.get("qk_layernorm"):                                     # each head's D channels
                q, k = norm(q, p + "attn.q_layernorm"), norm(k, p + "attn.k_layernorm")
            q, k = rotate(q), rotate(k)
            sc = np.where(causal, q @ k.transpose(0, 2, 1) / math.sqrt(D), -np.inf)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            heads.append((sc / sc.sum(-1, keepdims=True)) @ v)
        y = np.concatenate(heads, -1)                                     # (B, T, H*D)
        x = x + y @ t[p + "attn.proj.weight"].T + bias(p + "attn.proj.bias", (C,))
        a = norm(x, p + "ln_2")
        if m.get("swiglu"):
            W1, b1 = t[p + "mlp.fc1.weight"].reshape(2, Fh, C), bias(p + "mlp.fc1.bias", (2, Fh))
            gate, up = a @ W1[0].T + b1[0], a @ W1[1].T + b1[1]
            hdn = gate / (1 + np.exp(-gate)) * up
        else:
            u = a @ t[p + "mlp.fc1.weight"].T + bias(p + "mlp.fc1.bias", (Fh,))
            hdn = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
        x = x + hdn @ t[p + "mlp.fc2.weight"].T + bias(p + "mlp.fc2.bias", (C,))
    x = norm(x, "ln_f")
    logits = x @ t["lm_head.weight" if m.get("untie_embeddings_and_output_weights") else "wte.weight"].T
    mx = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - mx).sum(-1)) + mx[..., 0]
    return float((lse - np.take_along_axis(logits, tgt[..., None], -1)[..., 0]).mean())


def expected_shapes(m):
    """The parameters and global shapes of DESIGN / the issue, flattened to 2-D / 1-D."""
    C, H, L, V, P, Fh = (m[k] for k in ("hidden_size", "num_attention_heads", "num_layers", "vocab_size",
                                        "max_position_embeddings", "ffn_hidden_size"))
    D = m.get("kv_channels") or C // H
    G = m["num_query_groups"] if m.get("group_query_attention") else None
    ln = m.get("normalization") != "RMSNorm"
    bias = m.get("add_bias_linear", True)
    f1 = 2 * Fh if m.get("swiglu") else Fh
    qkv_rows = G * (H // G + 2) * D if G else 3 * H * D
    out = {"wte.weight": (V, C)}
    if m.get("position_embedding_type") != "rope":
        out["wpe.weight"] = (P, C)
    for i in range(L):
        p = f"h.{i}."
        out[p + "ln_1.weight"] = out[p + "ln_2.weight"] = (C,)
        if ln:
            out[p + "ln_1.bias"] = out[p + "ln_2.bias"] = (C,)
        out[p + "attn.qkv.weight"] = (qkv_rows, C)
        if bias or m.get("add_qkv_bias"):
            out[p + "attn.qkv.bias"] = (qkv_rows,)
        out[p + "attn.proj.weight"] = (C, H * D)
        out[p + "mlp.fc1.weight"] = (f1, C)
        out[p + "mlp.fc2.weight"] = (C, Fh)
        if m.get("qk_layernorm"):
            for n in ("q_layernorm", "k_layernorm"):
                out[p + "attn." + n + ".weight"] = (D,)
                if ln:
                    out[p + "attn." + n + ".bias"] = (D,)
        if bias:
            out[p + "attn.proj.bias"] = (C,)
            out[p + "mlp.fc1.bias"] = (f1,)
            out[p + "mlp.fc2.bias"] = (C,)
    out["ln_f.weight"] = (C,)
    if ln:
        out["ln_f.bias"] = (C,)
    if m.get("untie_embeddings_and_output_weights"):
        out["lm_head.weight"] = (V, C)
    return out


@check
def llama_forward_matches_numpy():
    msgs, ok = [], True
    for name, extra in VARIANTS.items():
        m = llama_cfg(extra)
        model = gpt_ref.build_model(m, torch.float64)
        shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
        if shapes != expected_shapes(m):
            return False, f"{name}: parameters {shapes} differ from the expected {expected_shapes(m)}"
        t = random_state(model, seed=len(name))
        model.load_state(t)
        tokens = np.random.default_rng(1).integers(0, m["vocab_size"], size=(3, m["seq_length"] + 1))
        # per-document positions as data.reset_position_ids makes them
        pos = np.array([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6], [0, 0, 1, 0, 1, 2, 3]])
        a = float(model.loss(torch.from_numpy(tokens)))
        b = numpy_model_loss(t, m, tokens)
        logits = model(torch.from_numpy(tokens[:, :-1]), torch.from_numpy(pos))
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, m["vocab_size"]),
                                               torch.from_numpy(tokens[:, 1:]).reshape(-1))
        c, d = float(ce), numpy_model_loss(t, m, tokens, pos)
        ok &= abs(a - b) < 1e-12 and abs(c - d) < 1e-12
        msgs.append(f"{name} {max(abs(a - b), abs(c - d)):.0e}")
    return ok, "float64 loss gpt_ref vs numpy-on-global-tensors (and with reset positions), |d|: " + ", ".join(msgs)


@check
def gradcheck_llama_float64():
    m = llama_cfg(dict(VARIANTS["llama"], rotary_interleaved=True, rotary_percent=0.8, add_qkv_bias=True,
                       rope_scaling=VARIANTS["rope_interleaved_half_scaled"]["rope_scaling"]),
                  L=1, C=8, H=4, V=7, P=5, Fh=6)
    model = gpt_ref.build_model(m, torch.float64)
    model.load_state(random_state(model, seed=7))
    wrapper = LossOf(model)
    names = [n for n, _ in wrapper.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in wrapper.named_parameters())
    tokens = torch.randint(0, m["vocab_size"], (2, m["seq_length"] + 1), generator=torch.Generator().manual_seed(0))

    def f(*ps):
        return torch.nn.utils.stateless.functional_call(wrapper, dict(zip(names, ps)), (tokens,))

    ok = torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-7, rtol=1e-5)
    n = sum(p.numel() for p in params)
    return ok, (f"RMSNorm + SwiGLU + interleaved scaled RoPE on 4 of 6 channels + GQA 4/2 + untied + QKV bias "
                f"only: gradcheck passed on {len(params)} tensors ({n} elements)")


@check
def rope_forms_agree():
    g = torch.Generator().manual_seed(5)
    rot, T = 12, 9
    x = torch.randn(2, T, 3, rot, generator=g, dtype=torch.float64)
    inv = model_ref.rope_inv_freq(rot, 10000.0).to(torch.float64)
    ang = (torch.arange(T, dtype=torch.float64)[:, None] * inv)[None, :, None, :]     # (1, T, 1, rot/2)
    cplx = model_ref.rope_complex(x, ang)                                                # pairs (2j, 2j+1)
    perm = torch.cat([torch.arange(0, rot, 2), torch.arange(1, rot, 2)])              # (2j, 2j+1) -> (j, j+rot/2)
    half = model_ref.rope_rotate_half(x[..., perm], torch.cos(ang), torch.sin(ang))[..., torch.argsort(perm)]
    d = float((cplx - half).abs().max())
    # explicit pairs, and the norm of every pair is kept
    want = x.clone()
    for j in range(rot // 2):
        c, s = torch.cos(ang[..., j]), torch.sin(ang[..., j])
        want[..., 2 * j] = x[..., 2 * j] * c - x[..., 2 * j + 1] * s
        want[..., 2 * j + 1] = x[..., 2 * j + 1] * c + x[..., 2 * j] * s
    d2 = float((cplx - want).abs().max())
    at0 = float((cplx[:, 0] - x[:, 0]).abs().max())                                    # position 0: identity
    # inv_freq: base^(-2j/rot) and Llama 3.1's rule vs one frequency at a time; the Llama 3.1 setting
    sc = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    errs = []
    for r, base, scaling in [(12, 10000.0, None), (128, 500000.0, sc), (64, 10000.0, sc), (6, 50.0,
                             VARIANTS["rope_interleaved_half_scaled"]["rope_scaling"])]:
        got = model_ref.rope_inv_freq(r, base, scaling).tolist()
        errs.append(max(abs(a - b) / b for a, b in zip(got, scalar_inv_freq(r, base, scaling))))
    full = model_ref.rope_inv_freq(128, 500000.0, None)
    scaled = model_ref.rope_inv_freq(128, 500000.0, sc)
    kept = int((scaled == full).sum())
    divided = int((torch.abs(scaled * 8 - full) <= 1e-6 * full).sum())
    ok = d < 1e-14 and d2 < 1e-14 and at0 == 0 and max(errs) == 0 and 0 < kept < 64 and 0 < divided < 64 \
        and kept + divided < 64
    return ok, (f"complex (2j, 2j+1) == rotate-half on permuted channels |d| {d:.1e}, == explicit pairs |d| {d2:.1e}; "
                f"inv_freq vs scalar Llama 3.1 rule: max rel d {max(errs):.1e}; Llama 3.1 (128, 5e5, x8): "
                f"{kept} kept, {divided} divided, {64 - kept - divided} interpolated")


def scalar_normal(seed, name, e):
    """normal_at in plain python integers and math, one element."""
    M = 0xFFFFFFFF
    s = 1469598103934665603
    for ch in name.encode():
        s = ((s ^ ch) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    c = [e & M, e >> 32, s & M, s >> 32]
    k = [seed & M, (seed >> 32) & M]
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & M, (p0 >> 32) ^ c[3] ^ k[1], p0 & M]
        k = [(k[0] + 0x9E3779B9) & M, (k[1] + 0xBB67AE85) & M]
    u = [((((a << 21) ^ (b >> 11)) & ((1 << 53) - 1)) + 1) / 2.0 ** 53 for a, b in ((c[0], c[1]), (c[2], c[3]))]
    return np.float32(math.sqrt(-2 * math.log(u[0])) * math.cos(2 * math.pi * u[1])), c, s


CPP_RNG = r"""
#include <cstdio>
#include <cstring>
#include <string>
#include "core/rng.h"
int main() {  // stdin lines "seed index name" -> stream, philox words, bits of normal_at
  unsigned long long seed, index;
  char name[256];
  while (std::scanf("%llu %llu %255s", &seed, &index, name) == 3) {
    const uint64_t stream = tpt::stream_id(name);
    const tpt::Philox4 r = tpt::philox4x32_10(stream, index, seed);
    const float v = tpt::normal_at(seed, stream, index);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    std::printf("%llu %u %u %u %u %u\n", (unsigned long long)stream, r.v[0], r.v[1], r.v[2], r.v[3], bits);
  }
}
"""


@check
def philox_init_matches_core_rng(work):
    # Random123's known answers for Philox4x32-10 (counter words c0..c3, key k0, k1)
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    ok = True
    for c, k, want in kat:  # core/rng.h: counter_lo = (c1, c0), counter_hi = (c3, c2), key = (k1, k0)
        got = init_ref.philox4x32_10(c[3] << 32 | c[2], np.array([c[1] << 32 | c[0]], np.uint64), k[1] << 32 | k[0])
        ok &= tuple(int(w[0]) for w in got) == want
    cases = [(1234, e, n) for n in ("wte.weight", "h.1.attn.qkv.weight", "lm_head.weight")
             for e in (0, 1, 2, 777, 12345, (1 << 32) + 5)] + [((1 << 40) + 7, 3, "h.0.mlp.fc1.weight")]
    scalar_ok = all(init_ref.normal_at(sd, init_ref.stream_id(n), np.array([e], np.uint64))[0]
                    == scalar_normal(sd, n, e)[0] for sd, e, n in cases)
    ok &= scalar_ok
    msg = f"Random123 known answers; numpy == scalar python on {len(cases)} elements: {scalar_ok}"
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if not cxx:
        return ok, msg + "; no C++ compiler: core/rng.h not compared"
    src, exe = os.path.join(work, "rng_check.cpp"), os.path.join(work, "rng_check")
    with open(src, "w") as f:
        f.write(CPP_RNG)
    root = os.path.dirname(os.path.dirname(HERE))
    r = subprocess.run([cxx, "-std=c++20", "-O2", "-I", root, src, "-o", exe], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"cannot compile a program with core/rng.h: {r.stderr[-500:]}"
    many = [(1234, e, "h.0.attn.proj.weight") for e in range(4096)]
    r = subprocess.run([exe], input="".join(f"{sd} {e} {n}\n" for sd, e, n in cases + many),
                       capture_output=True, text=True, check=True)
    rows = [[int(v) for v in line.split()] for line in r.stdout.split("\n") if line]
    ok &= len(rows) == len(cases) + len(many)
    bad = 0
    for (sd, e, n), row in zip(cases, rows):
        v, words, stream = scalar_normal(sd, n, e)
        bad += row[0] != stream or row[1:5] != words or row[5] != int(np.float32(v).view(np.uint32))
    vals = init_ref.normal_at(1234, init_ref.stream_id("h.0.attn.proj.weight"), np.arange(4096, dtype=np.uint64))
    bits = np.array([row[5] for row in rows[len(cases):]], dtype=np.uint32)
    diff = int((vals.view(np.uint32) != bits).sum())
    ok &= bad == 0 and diff == 0
    return ok, msg + (f"; core/rng.h compiled with {os.path.basename(cxx)}: stream ids, Philox words and "
                      f"normal_at bits equal on {len(cases)} cases ({bad} differ) and {diff} of 4096 "
                      f"normals differ")


@check
def tptrain_init_rules():
    m = llama_cfg(dict(LLAMA, num_query_groups=2), L=2, C=64, H=8, V=97, P=16, Fh=96)
    m["seq_length"] = 16
    model = gpt_ref.build_model(m)
    t0 = time.perf_counter()
    state = gpt_ref.tptrain_init_state(model, m, 1234)
    dt = time.perf_counter() - t0
    n = sum(v.size for v in state.values())
    ok = dt < 1.0 and all(v.dtype == np.float32 for v in state.values())
    std, out_std = np.float32(0.02), np.float32(np.float32(0.02) / np.sqrt(np.float32(4)))
    kinds = {}
    for name, v in state.items():
        if name.endswith(init_ref.NORM_WEIGHTS):
            ok &= bool((v == 1).all())
            kinds.setdefault("ones", []).append(name)
            continue
        s = out_std if name.endswith(init_ref.OUTPUT_PROJECTIONS) else std
        e = [0, 1, v.size // 2, v.size - 1]  # flat row-major index in the global shape
        ok &= all(v.reshape(-1)[i] == s * scalar_normal(1234, name, i)[0] for i in e)
        ok &= abs(float(v.std()) / float(s) - 1) < 0.05 and abs(float(v.mean())) < 0.05 * float(s)
        kinds.setdefault(f"N(0, {float(s):.4g})", []).append(name)
    # a GPT-2 model: biases zero, and the same name gets the same values whatever else changes
    g = tiny_cfg(L=2, C=64, H=8, V=97, P=16, Fh=96)
    g["init_method_std"] = 0.02
    s2 = gpt_ref.tptrain_init_state(gpt_ref.build_model(g), g, 1234)
    ok &= all(not v.any() for k, v in s2.items() if k.endswith(".bias"))
    ok &= np.array_equal(s2["h.1.mlp.fc2.weight"], state["h.1.mlp.fc2.weight"]) and \
        np.array_equal(s2["wte.weight"], state["wte.weight"])
    ok &= not np.array_equal(state["wte.weight"], state["lm_head.weight"])
    decayed = sorted(n for n, _ in model.named_parameters() if gpt_ref.is_decayed(n))
    ok &= decayed == sorted(n for n in state if n.endswith(".weight") and not n.endswith(init_ref.NORM_WEIGHTS))
    return ok, (f"{n} elements in {dt * 1e3:.0f} ms; " + "; ".join(f"{k}: {len(v)} tensors" for k, v in kinds.items())
                + "; biases 0; by name and flat global index; decay on the weight matrices")


LLAMA_CFG = """model: {num_layers: 2, hidden_size: 64, num_attention_heads: 8, ffn_hidden_size: 96, seq_length: 16,
        max_position_embeddings: 16, vocab_size: 97, normalization: RMSNorm, swiglu: true,
        position_embedding_type: rope, group_query_attention: true, num_query_groups: 2,
        untie_embeddings_and_output_weights: true, add_bias_linear: false, init_from: null}
training: {micro_batch_size: 8, global_batch_size: 8, train_iters: 10, precision: fp32, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_style: cosine,
            weight_decay: 0.3, adam_beta1: 0.9, adam_beta2: 0.95, adam_eps: 1.0e-8, clip_grad: 1.5}
data: {shuffle: false, split: [1, 0, 0]}
logging: {log_interval: 1}
"""


@check
def cli_llama_from_tptrain_init(work):
    cfg = os.path.join(work, "llama.yaml")
    with open(cfg, "w") as f:
        f.write(LLAMA_CFG)
    with redirect_stderr(io.StringIO()):
        make_tokens.main(["--vocab", "97", "--tokens", "1225", "--docs", "7", "--megatron", os.path.join(work, "lmeg")])
    data = ["--set", "data.path=" + os.path.join(work, "lmeg")]
    runs = {"l8": [], "l4x2": ["--set", "training.micro_batch_size=4"],
            "lreset": ["--set", "data.reset_position_ids=true", "--set", "data.eod_token_id=5"]}
    recs, err = cli_runs(work, ["--config", cfg] + data, runs)
    if err:
        return False, err
    d = max(abs(a["lm_loss"] - b["lm_loss"]) for a, b in zip(recs["l8"], recs["l4x2"]))
    dr = max(abs(a["lm_loss"] - b["lm_loss"]) for a, b in zip(recs["l8"], recs["lreset"]))
    losses = [r["lm_loss"] for r in recs["l8"]]
    # errors: HF GPT-2 weights for a LLaMA model, a misspelt choice, groups that do not divide the heads
    errs = [cli(["--config", cfg, "--init", "w.safetensors"] + data),
            cli(["--config", cfg, "--set", "model.normalization=rmsnorm"] + data),
            cli(["--config", cfg, "--set", "model.num_query_groups=3"] + data),
            cli(["--config", cfg, "--set", "model.rotary_percent=0.1"] + data),
            cli(["--config", cfg, "--set", "model.rope_scaling={factor: 8}"] + data)]
    words = ["HF GPT-2 weights only", "model.normalization", "model.num_query_groups", "model.rotary_percent",
             "model.rope_scaling"]
    errs_ok = all(rc == 2 and w in e for (rc, e), w in zip(errs, words))
    ok = (len(losses) == 10 and abs(losses[0] - math.log(97)) < 0.05 and losses[-1] < losses[0] - 0.3
          and d < 1e-5 and 0 < dr < 1 and errs_ok)
    return ok, (f"Llama shape from tptrain's init: loss {losses[0]:.4f} (ln 97 = {math.log(97):.4f}) -> "
                f"{losses[-1]:.4f}; micro 4x2 vs 8 max |d loss| {d:.1e}; reset positions change the losses by "
                f"up to {dr:.1e}; bad configs rejected: {errs_ok}")
