#!/usr/bin/env python3
"""PyTorch eager baseline for scripts/gpu_check.sh: the same GPT-2 shape tptrain benchmarks, trained
the way a PyTorch user would on one GPU -- fp32 master weights, bf16 autocast, causal
scaled_dot_product_attention (flash / cuDNN kernels where PyTorch picks them), fused AdamW -- on
random tokens. Prints one JSON line: ms per iteration, tokens/s, peak GPU memory.

    python3 scripts/bench_torch.py --layers 12 --hidden 768 --heads 12 --seq 1024 --micro-batch 16
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
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch < 2.0
            s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = s.softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


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
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible to PyTorch"}))
        return 1
    torch.manual_seed(0)
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
