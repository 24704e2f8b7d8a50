"""Helpers shared by the reference self-checks (selftest.py, selftest_llama.py): the check registry,
a tiny config, a loss wrapper for autograd and the reference CLI run in-process."""
import io
import json
import os
from contextlib import redirect_stderr

import torch

import gpt_ref

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def tiny_cfg(L=2, C=8, H=2, V=11, P=6, Fh=None):
    return {"num_layers": L, "hidden_size": C, "num_attention_heads": H, "ffn_hidden_size": Fh or 4 * C,
            "seq_length": P, "max_position_embeddings": P, "vocab_size": V, "layernorm_epsilon": 1e-5}


class LossOf(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, tokens):
        return self.m.loss(tokens)


def cli(args):
    err = io.StringIO()
    with redirect_stderr(err):
        rc = gpt_ref.main(args)
    return rc, err.getvalue()


def cli_runs(work, base, runs):
    """Runs the reference CLI with base + extra for each name -> extra of runs, metrics to WORK/name.jsonl.
    Returns ({name: metrics records}, None), or (None, the first failure)."""
    for name, extra in runs.items():
        rc, err = cli(base + ["--out", os.path.join(work, name + ".jsonl")] + extra)
        if rc != 0:
            return None, f"gpt_ref {name} failed: {err}"
    return {n: [json.loads(line) for line in open(os.path.join(work, n + ".jsonl"))] for n in runs}, None
