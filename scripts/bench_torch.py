#!/usr/bin/env python3
"""PyTorch eager baseline for scripts/gpu_check.sh: the same GPT-2 shape tptrain benchmarks, trained
the way a PyTorch user would on one GPU -- fp32 master weights, bf16 autocast, causal
scaled_dot_product_attention (flash / cuDNN kernels where PyTorch picks them), fused AdamW -- on
random tokens. Prints one JSON line: ms per iteration, tokens/s, peak GPU memory.

    python3 scripts/bench_torch.py --layers 12 --hidden 768 --heads 12 --seq 1024 --micro-batch 16
    python3 scripts/bench_torch.py --llama --layers 2 --hidden 4096 --heads 32 --groups 8 --ffn 14336 \
        --vocab 128256 --seq 4096 --micro-batch 1     # Llama-3-8B-shaped layers (RMSNorm, SwiGLU, RoPE, GQA)
    python3 scripts/bench_torch.py --device cpu --layers 2 --hidden 64 --heads 4 --seq 32 --vocab 97 \
        --micro-batch 2 --iters 3 --warmup 1          # a dry run without a GPU

Needs PyTorch >= 2.0 for scaled_dot_product_attention (older versions: an explicit softmax).
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def causal_attention(q, k, v):  # (B, H, T, D) each
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]  # PyTorch < 2.0
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.fc1 = nn.Linear(C, 4 * C)
        self.fc2 = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)
        y = causal_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate(x, cos, sin):  # rotate-half RoPE of x (B, H, T, D)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    """Llama's block as transformers' LlamaDecoderLayer computes it: RMSNorm, GQA with rotate-half RoPE
    (the K/V heads repeated for SDPA, as LlamaAttention's repeat_kv does), SwiGLU, no biases."""

    def __init__(self, C, H, G, Fh):
        super().__init__()
        self.H, self.G, self.D = H, G, C // H
        self.ln_1 = RMSNorm(C)
        self.q = nn.Linear(C, H * self.D, bias=False)
        self.kv = nn.Linear(C, 2 * G * self.D, bias=False)
        self.proj = nn.Linear(H * self.D, C, bias=False)
        self.ln_2 = RMSNorm(C)
        self.gate_up = nn.Linear(C, 2 * Fh, bias=False)
        self.down = nn.Linear(Fh, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.ln_1(x)
        q = self.q(h).view(B, T, self.H, self.D).transpose(1, 2)
        k, v = self.kv(h).view(B, T, 2, self.G, self.D).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = (t.repeat_interleave(self.H // self.G, dim=1) for t in (k, v))
        y = causal_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, self.H * self.D))
        gate, up = self.gate_up(self.ln_2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, L, C, H, G, Fh, S, V, base=500000.0):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.h = nn.ModuleList(LlamaBlock(C, H, G, Fh) for _ in range(L))
        self.ln_f = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)  # untied
        D = C // H
        inv = 1.0 / (base ** (torch.arange(0, D, 2).float() / D))
        ang = torch.outer(torch.arange(S).float(), inv)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin(), persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx)
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.h:
            x = b(x, cos, sin)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


class GPT(nn.Module):
    def __init__(self, L, C, H, S, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(S, C)
        self.h = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304, help="padded GPT-2 vocabulary, as tptrain pads it")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10, help="timed iterations")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--llama", action="store_true", help="the Llama shape: RMSNorm, SwiGLU, RoPE, GQA, untied, no bias")
    ap.add_argument("--groups", type=int, default=8, help="--llama: key/value heads")
    ap.add_argument("--ffn", type=int, default=14336, help="--llama: SwiGLU's hidden size")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible to PyTorch"}))
        return 1
    torch.manual_seed(0)
    if a.llama:
        model = Llama(a.layers, a.hidden, a.heads, a.groups, a.ffn, a.seq, a.vocab).to(dev)
    else:
        model = GPT(a.layers, a.hidden, a.heads, a.seq, a.vocab).to(dev)
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **fused)
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step():
        idx = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), device=dev)
        with amp:
            loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        loss = step()
    sync()
    ms = (time.perf_counter() - t0) * 1000.0 / a.iters
    attn = "SDPA" if hasattr(F, "scaled_dot_product_attention") else "explicit softmax attention"
    out = {"system": f"pytorch {torch.__version__} eager, bf16 autocast, {attn}, {'fused ' if fused else ''}AdamW",
           "ms_per_iteration": ms, "tokens_per_s": a.micro_batch * a.seq / (ms / 1000.0),
           "loss": float(loss), "micro_batch": a.micro_batch, "seq": a.seq}
    if dev.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
