#!/usr/bin/python3
"""Self-checks of the PyTorch reference (gpt_ref.py) and its helpers, independent of tptrain.

  selftest.py [--work DIR] [--quick] [--only NAMES] [--skip NAMES]

Checks: autograd vs finite differences (torch.autograd.gradcheck, float64) of the loss in all
parameters; the accumulated micro-batch gradient vs the full-batch gradient; the loaded model vs an
independent numpy GPT-2 written directly on HF's Conv1D tensors; F16/BF16/prefix/buffer loading;
AdamW + clipping vs DESIGN's formulas in numpy; LR schedule values; document split rule; both token
formats; loss at init ~ ln(V); micro 4x2 == micro 8 and Megatron == llm.c through the CLI; then the
LLaMA-family checks of selftest_llama.py and the Mixture-of-Experts checks of selftest_moe.py.
Prints one line per check and exits non-zero if any fails.
"""
import argparse
import io
import math
import os
import sys
import tempfile
import traceback
from contextlib import redirect_stderr

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # keep the source tree clean when run from ctest
import compare_metrics  # noqa: E402
import gpt_ref  # noqa: E402
import make_hf_weights  # noqa: E402
import make_tokens  # noqa: E402
from selftest_common import CHECKS, LossOf, check, cli, cli_runs, tiny_cfg  # noqa: E402

def tiny_model(m, seed=3, std=0.3):
    """A float64 GPT whose weights come from make_hf_weights' generator via the HF mapping."""
    t = make_hf_weights.make_gpt2(m["num_layers"], m["hidden_size"], m["vocab_size"],
                                  m["max_position_embeddings"], m["ffn_hidden_size"], std, seed)
    model = gpt_ref.build_model(m, torch.float64)
    model.load_state(gpt_ref.hf_to_state({k: v.astype(np.float64) for k, v in t.items()}, m))
    return model, t


@check
def gradcheck_float64():
    m = tiny_cfg()
    model, _ = tiny_model(m)
    wrapper = LossOf(model)
    names = [n for n, _ in wrapper.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in wrapper.named_parameters())
    tokens = torch.randint(0, m["vocab_size"], (2, m["seq_length"] + 1), generator=torch.Generator().manual_seed(0))

    def f(*ps):
        return torch.nn.utils.stateless.functional_call(wrapper, dict(zip(names, ps)), (tokens,))

    ok = torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-7, rtol=1e-5)
    n = sum(p.numel() for p in params)
    return ok, f"torch.autograd.gradcheck passed on all {len(params)} parameter tensors ({n} elements)"


@check
def accumulated_gradient_equals_full_batch():
    m = tiny_cfg()
    model, _ = tiny_model(m)
    tokens = torch.randint(0, m["vocab_size"], (4, m["seq_length"] + 1), generator=torch.Generator().manual_seed(1))
    ref = torch.autograd.grad(model.loss(tokens), list(model.parameters()))
    o = {"weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-8, "lr": 0.0}
    opt = gpt_ref.make_optimizer(model, o)
    loss, gn = gpt_ref.train_step(model, opt, [tokens[:2], tokens[2:]], lr=0.0, clip_grad=0.0)
    full_loss = float(model.loss(tokens))  # lr 0, wd 0: parameters unchanged
    err = max(float((p.grad - r).abs().max()) for p, r in zip(model.parameters(), ref))
    gn_ref = math.sqrt(sum(float((r ** 2).sum()) for r in ref))
    # finite difference along a random direction, of the full-batch mean loss
    g = torch.Generator().manual_seed(2)
    dirs = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in model.parameters()]
    h = 1e-5
    with torch.no_grad():
        base = [p.clone() for p in model.parameters()]
        vals = []
        for s in (+1, -1):
            for p, b, d in zip(model.parameters(), base, dirs):
                p.copy_(b + s * h * d)
            vals.append(float(model.loss(tokens)))
        for p, b in zip(model.parameters(), base):
            p.copy_(b)
    fd = (vals[0] - vals[1]) / (2 * h)
    an = sum(float((p.grad * d).sum()) for p, d in zip(model.parameters(), dirs))
    ok = err < 1e-12 and abs(loss - full_loss) < 1e-12 and abs(gn - gn_ref) < 1e-10 and abs(fd - an) < 1e-6 * max(1, abs(an))
    return ok, (f"2 micro-batches vs full batch: max grad diff {err:.1e}, loss diff {abs(loss - full_loss):.1e}, "
                f"grad-norm diff {abs(gn - gn_ref):.1e}; directional derivative analytic {an:.9f} vs "
                f"finite-difference {fd:.9f}")


def numpy_gpt2_loss(t, m, tokens):
    """GPT-2 straight from HF tensors (Conv1D: y = x @ W + b), float64 numpy; mean CE."""
    C, H = m["hidden_size"], m["num_attention_heads"]
    D = C // H
    eps = m["layernorm_epsilon"]

    def ln(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w + b

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    inp, tgt = tokens[:, :-1], tokens[:, 1:]
    B, T = inp.shape
    x = t["wte.weight"][inp] + t["wpe.weight"][:T][None]
    for i in range(m["num_layers"]):
        p = lambda n: t[f"h.{i}.{n}"]  # noqa: E731
        a = ln(x, p("ln_1.weight"), p("ln_1.bias"))
        qkv = a @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = (qkv[..., j * C:(j + 1) * C].reshape(B, T, H, D).transpose(0, 2, 1, 3) for j in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        y = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        a = ln(x, p("ln_2.weight"), p("ln_2.bias"))
        x = x + gelu(a @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")) @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = ln(x, t["ln_f.weight"], t["ln_f.bias"])
    logits = x @ t["wte.weight"].T
    mx = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - mx).sum(-1)) + mx[..., 0]
    return float((lse - np.take_along_axis(logits, tgt[..., None], -1)[..., 0]).mean())


@check
def model_matches_numpy_hf_forward():
    m = tiny_cfg(L=3, C=12, H=3, V=13, P=7, Fh=20)
    model, t = tiny_model(m, seed=5, std=0.5)
    t = {k: v.astype(np.float64) for k, v in t.items()}
    tokens = np.random.default_rng(0).integers(0, 13, size=(3, 8))
    a = float(model.loss(torch.from_numpy(tokens)))
    b = numpy_gpt2_loss(t, m, tokens)
    return abs(a - b) < 1e-12, f"float64 loss gpt_ref {a:.15f} vs numpy-on-HF-tensors {b:.15f} (|d| {abs(a - b):.1e})"


@check
def safetensors_dtypes_prefix_buffers(work):
    m = tiny_cfg(L=2, C=8, H=2, V=11, P=6)
    t = make_hf_weights.make_gpt2(2, 8, 11, 6, None, 0.3, 9)
    msgs, ok = [], True
    for dt in ("f32", "f16", "bf16"):
        path = os.path.join(work, f"st_{dt}.safetensors")
        with redirect_stderr(io.StringIO()):
            make_hf_weights.main(["--out", path, "--layers", "2", "--hidden", "8", "--heads", "2", "--vocab", "11",
                                  "--positions", "6", "--std", "0.3", "--seed", "9", "--dtype", dt, "--prefix"])
        with open(path, "rb") as f:
            hlen = int.from_bytes(f.read(8), "little")
            ok &= hlen % 8 == 0
        got = gpt_ref.read_safetensors(path)
        ok &= any(k.endswith("attn.bias") for k in got) and all(k.startswith("transformer.") for k in got)
        for name, src in t.items():
            if dt == "f32":
                want = src.astype(np.float64)
            elif dt == "f16":
                want = src.astype(np.float16).astype(np.float64)
            else:  # torch's own fp32 -> bf16 rounding as the independent oracle
                want = torch.from_numpy(src).to(torch.bfloat16).to(torch.float64).numpy()
            d = float(np.abs(got["transformer." + name] - want).max())
            ok &= d == 0.0
        state = gpt_ref.hf_to_state(got, m, path)  # prefix stripped, buffers ignored
        ok &= np.array_equal(state["h.1.mlp.fc2.weight"], got["transformer.h.1.mlp.c_proj.weight"].T)
        msgs.append(dt)
    # a wrong shape and a missing tensor are errors naming the tensor
    bad = dict(gpt_ref.read_safetensors(os.path.join(work, "st_f32.safetensors")))
    bad["transformer.h.0.attn.c_attn.weight"] = bad["transformer.h.0.attn.c_attn.weight"].T
    try:
        gpt_ref.hf_to_state(bad, m)
        ok = False
    except gpt_ref.RefError as e:
        ok &= "c_attn.weight" in str(e)
    return ok, f"F32/F16/BF16 with transformer. prefix + attn.bias buffers read exactly ({', '.join(msgs)}); bad shape rejected"


@check
def adamw_and_clipping_match_design_formulas():
    m = tiny_cfg()
    model, _ = tiny_model(m, seed=4)
    o = {"lr": 1e-2, "weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-8}
    opt = gpt_ref.make_optimizer(model, o)
    names = [n for n, _ in model.named_parameters()]
    P = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    M = {n: np.zeros_like(v) for n, v in P.items()}
    Vv = {n: np.zeros_like(v) for n, v in P.items()}
    g = torch.Generator().manual_seed(3)
    worst, clipped = 0.0, []
    for step, (lr, clip) in enumerate([(1e-2, 0.5), (5e-3, 100.0), (2e-3, 0.5)], 1):
        tokens = torch.randint(0, m["vocab_size"], (2, m["seq_length"] + 1), generator=g)
        grads = torch.autograd.grad(model.loss(tokens), list(model.parameters()))
        G = {n: gr.numpy().copy() for n, gr in zip(names, grads)}
        gpt_ref.train_step(model, opt, [tokens], lr, clip)
        norm = math.sqrt(sum(float((x ** 2).sum()) for x in G.values()))
        scale = clip / (norm + 1e-6) if norm > clip else 1.0
        clipped.append(norm > clip)
        b1, b2, eps, wd = 0.9, 0.95, 1e-8, 0.1
        for n in names:
            gr = G[n] * scale
            if P[n].ndim == 2:
                P[n] = P[n] * (1 - lr * wd)
            M[n] = b1 * M[n] + (1 - b1) * gr
            Vv[n] = b2 * Vv[n] + (1 - b2) * gr * gr
            mhat = M[n] / (1 - b1 ** step)
            vhat = Vv[n] / (1 - b2 ** step)
            P[n] = P[n] - lr * mhat / (np.sqrt(vhat) + eps)
        for n, p in model.named_parameters():
            worst = max(worst, float(np.abs(p.detach().numpy() - P[n]).max()))
    ok = worst < 1e-12 and clipped == [True, False, True]
    return ok, f"3 steps (clipped {clipped}): max |param - numpy AdamW| {worst:.1e}; decay on 2-D weights only"


@check
def lr_schedule_values():
    f = gpt_ref.lr_at
    cases = [(f(1, 1e-3, 1e-4, 2, 10, "cosine"), 5e-4), (f(2, 1e-3, 1e-4, 2, 10, "cosine"), 1e-3),
             (f(6, 1e-3, 1e-4, 2, 10, "cosine"), 5.5e-4), (f(10, 1e-3, 1e-4, 2, 10, "cosine"), 1e-4),
             (f(11, 1e-3, 1e-4, 2, 10, "cosine"), 1e-4),
             (f(4, 1e-3, 1e-4, 2, 10, "cosine"), 1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi * 0.25))),
             (f(4, 1e-3, 1e-4, 2, 10, "linear"), 7.75e-4), (f(7, 1e-3, 1e-4, 2, 10, "constant"), 1e-3),
             (f(1, 1e-3, 0.0, 0, 10, "cosine"), 0.5e-3 * (1 + math.cos(math.pi * 0.1)))]
    err = max(abs(a - b) for a, b in cases)
    return err < 1e-15, f"{len(cases)} schedule points (warmup, cosine, linear, constant, past decay) max |d| {err:.1e}"


@check
def split_rule():
    s = gpt_ref.split_documents
    cases = [(s(10, [949, 50, 1]), [(0, 10), (10, 10), (10, 10)]),
             (s(1000, [949, 50, 1]), [(0, 949), (949, 999), (999, 1000)]),
             (s(100, [8, 1, 1]), [(0, 80), (80, 90), (90, 100)]),
             (s(7, [1, 0, 0]), [(0, 7), (7, 7), (7, 7)]),
             (s(7, [100]), [(0, 7), (7, 7), (7, 7)]),
             (s(10, [949, 50, 1], "cumsum"), [(0, 9), (9, 10), (10, 10)])]
    bad = [(a, b) for a, b in cases if a != b]
    return not bad, f"{len(cases)} Megatron split cases" + (f"; wrong: {bad}" if bad else "")


@check
def token_formats(work):
    ok = True
    stream = make_tokens.make_stream(1000, 97, "markov", 4)
    lengths = make_tokens.doc_lengths(1000, 6, 4)
    for dt in ("u16", "i32"):
        make_tokens.write_megatron(os.path.join(work, f"tok_{dt}"), stream, lengths, dt)
        docs = gpt_ref.open_corpus(os.path.join(work, f"tok_{dt}"), 97)
        ok &= [len(d) for d in docs] == list(lengths) and np.array_equal(np.concatenate(docs), stream)
    make_tokens.write_llmc(os.path.join(work, "tok.bin"), stream)
    docs = gpt_ref.open_corpus(os.path.join(work, "tok.bin"), 97)
    ok &= len(docs) == 1 and np.array_equal(docs[0], stream)
    data = gpt_ref.SequentialData(docs, (0, 1), 16)
    ok &= data.num_samples == 999 // 16 and np.array_equal(data.sample(2), stream[32:49])
    ok &= np.array_equal(data.sample(data.num_samples + 1), stream[16:33])  # wraps
    errors = 0
    with open(os.path.join(work, "tok_u16.bin"), "r+b") as f:
        f.truncate(1000)  # 500 tokens: pointers run past the end
    for path, vocab in [(os.path.join(work, "tok_u16"), 97), (os.path.join(work, "tok_i32"), 50),
                        (os.path.join(work, "nothing"), 97)]:
        try:
            gpt_ref.open_corpus(path, vocab)
        except gpt_ref.RefError:
            errors += 1
    ok &= errors == 3
    return ok, "Megatron u16/i32 and llm.c read back the generated stream; samples, wrap, truncation/vocab errors"


@check
def loss_at_init_is_ln_vocab(work):
    m = tiny_cfg(L=2, C=64, H=4, V=97, P=16)
    model = gpt_ref.build_model(m)
    t = make_hf_weights.make_gpt2(2, 64, 97, 16, None, 0.02, 1)
    model.load_state(gpt_ref.hf_to_state({k: v.astype(np.float64) for k, v in t.items()}, m))
    tokens = torch.from_numpy(make_tokens.make_stream(8 * 17, 97, "random", 1).reshape(8, 17))
    loss = float(model.loss(tokens))
    return abs(loss - math.log(97)) < 0.05, f"loss at init {loss:.5f} vs ln(97) = {math.log(97):.5f}"


CFG = """model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 16,
        max_position_embeddings: 16, vocab_size: 97, make_vocab_size_divisible_by: 128,
        layernorm_epsilon: 1.0e-5, hidden_dropout: 0.0, attention_dropout: 0.0}
training: {micro_batch_size: 8, global_batch_size: 8, train_iters: 10, precision: fp32}
optimizer: {lr: 1.0e-3, min_lr: 1.0e-4, lr_warmup_iters: 2, lr_decay_style: cosine,
            weight_decay: 0.1, adam_beta1: 0.9, adam_beta2: 0.95, adam_eps: 1.0e-8, clip_grad: 1.5}
data: {shuffle: false, split: [1, 0, 0]}
logging: {log_interval: 1}
"""


@check
def cli_microbatch_and_formats(work):
    cfg = os.path.join(work, "cfg.yaml")
    with open(cfg, "w") as f:
        f.write(CFG)
    w = os.path.join(work, "w.safetensors")
    with redirect_stderr(io.StringIO()):
        make_hf_weights.main(["--out", w, "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "97",
                              "--positions", "16", "--seed", "1"])
        make_tokens.main(["--vocab", "97", "--tokens", "1225", "--docs", "7", "--megatron", os.path.join(work, "meg"),
                          "--llmc", os.path.join(work, "shard.bin")])
    runs = {"meg8": ["--set", "data.path=" + os.path.join(work, "meg")],
            "meg4x2": ["--set", "data.path=" + os.path.join(work, "meg"), "--set", "training.micro_batch_size=4"],
            "llmc": ["--set", "data.path=" + os.path.join(work, "shard.bin")],
            "meg8_f64": ["--float64", "--set", "data.path=" + os.path.join(work, "meg")],
            "meg4x2_f64": ["--float64", "--set", "data.path=" + os.path.join(work, "meg"),
                           "--set", "training.micro_batch_size=4"]}
    recs, err = cli_runs(work, ["--config", cfg, "--init", w], runs)
    if err:
        return False, err
    same_formats = recs["meg8"] == recs["llmc"]
    out = io.StringIO()
    from contextlib import redirect_stdout
    with redirect_stdout(out):
        rc = compare_metrics.main([os.path.join(work, "meg8.jsonl"), os.path.join(work, "meg4x2.jsonl"),
                                   "--loss-abs", "1e-6", "--gradnorm-rel", "1e-6", "--lr-rel", "1e-12"])
    d_loss = max(abs(a["lm_loss"] - b["lm_loss"]) for a, b in zip(recs["meg8"], recs["meg4x2"]))
    d_gn = max(abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"] for a, b in zip(recs["meg8"], recs["meg4x2"]))
    d64 = max(max(abs(a["lm_loss"] - b["lm_loss"]), abs(a["grad_norm"] - b["grad_norm"]))
              for a, b in zip(recs["meg8_f64"], recs["meg4x2_f64"]))
    d3264 = max(abs(a["lm_loss"] - b["lm_loss"]) for a, b in zip(recs["meg8"], recs["meg8_f64"]))
    clipped = sum(r["grad_norm"] > 1.5 for r in recs["meg8"])
    losses = [r["lm_loss"] for r in recs["meg8"]]
    # config errors are loud and name the key
    rc_bad, err_bad = cli(["--config", cfg, "--init", w, "--set", "data.path=x", "--set", "data.shufle=false"])
    rc_shuf, err_shuf = cli(["--config", cfg, "--init", w, "--set", "data.path=x", "--set", "data.shuffle=true"])
    ok = (rc == 0 and d64 < 1e-12 and d3264 < 1e-4 and same_formats and len(losses) == 10 and 0 < clipped < 10 and losses[-1] < losses[0]
          and rc_bad == 2 and "did you mean 'shuffle'" in err_bad and rc_shuf == 2 and "shuffle" in err_shuf)
    return ok, (f"10 iterations: micro 4x2 vs 8 max |d loss| {d_loss:.1e}, max rel d grad_norm {d_gn:.1e}; "
                f"float64: max |d| {d64:.1e}; fp32 vs float64 max |d loss| {d3264:.1e}; "
                f"Megatron == llm.c exactly: {same_formats}; clipped on {clipped}/10 steps; loss "
                f"{losses[0]:.4f} -> {losses[-1]:.4f}; bad keys rejected")


import selftest_llama  # noqa: E402,F401  (registers the LLaMA-family checks after these)
import selftest_moe  # noqa: E402,F401  (and the Mixture-of-Experts checks: --only moe)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", help="scratch directory (default: a temporary one)")
    p.add_argument("--quick", action="store_true", help="skip the gradchecks (the slowest checks)")
    p.add_argument("--only", help="comma-separated substrings: run the checks whose names contain one")
    p.add_argument("--skip", help="comma-separated substrings: skip the checks whose names contain one")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    work = a.work or tempfile.mkdtemp(prefix="gpt_ref_selftest_")
    os.makedirs(work, exist_ok=True)
    failed = ran = 0
    for fn in CHECKS:
        if a.quick and fn.__name__.startswith("gradcheck"):
            continue
        if a.only and not any(w in fn.__name__ for w in a.only.split(",")):
            continue
        if a.skip and any(w in fn.__name__ for w in a.skip.split(",")):
            continue
        ran += 1
        try:
            ok, msg = fn(work) if fn.__code__.co_argcount else fn()
        except Exception:
            ok, msg = False, traceback.format_exc()
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {fn.__name__}: {msg}", flush=True)
    print(f"selftest: {ran - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
