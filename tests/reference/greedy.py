#!/usr/bin/python3
"""Greedy continuation of a prompt by the PyTorch reference model (gpt_ref.py's GPT) from Hugging Face
GPT-2 or Llama weights (hf_llama_ref.py), e.g. those `tptrain export` writes -- Mixtral / Qwen2-MoE / Qwen3-MoE
directories run transformers' forward as hf_moe_ref.HFMoEModel transcribes it -- or from a tptrain
checkpoint itself (any model the reference builds, Mixture-of-Experts too), with the byte-level tokenizer (bytes 0..255, end of document 256): what
`tptrain generate --temperature 0` must print.

  greedy.py (--model DIR | --checkpoint CKPT) --prompt TEXT [--max-new-tokens N] [--float64] [--check FILE]

With --check FILE (what `tptrain generate --temperature 0` printed) nothing is generated: the text is
fed to the model once and each token generate chose must be the best (up to a 1e-4 tie) and generate
must have stopped where its rules say; prints one line saying so, exits 1 naming the first token that
is not.

DIR holds config.json and model.safetensors (Llama: or shards with model.safetensors.index.json).
CKPT is a checkpoint.save directory (its latest iteration) or one iter_N directory: meta.json's
config.model builds the reference model (model_ref.py; an MoE model routes with no capacity, as
generation does: docs/MOE.md), the tensors come from tests/tools/checkpoint_tensors.py (the word
embedding and output layer without their vocabulary padding rows; the MoE layers' expert biases).
Decoding follows tptrain generate's rules: the whole context runs through the model every step (no
cache), the next token is the argmax of the last position's logits (ties: the lowest id, as torch.argmax), generation stops at the end-of-document
token, after N tokens, or once the text holds max_position_embeddings + 1 tokens (the last
position that can be fed is max_position_embeddings - 1). Prints the prompt and the continuation
and a newline to stdout; to stderr the smallest gap between the best and the second-best logit
met on the way (a gap near 1e-5 would make a tie-break between implementations fragile).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import gpt_ref  # noqa: E402
import hf_llama_ref  # noqa: E402
import hf_moe_ref  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import checkpoint_tensors  # noqa: E402  (tests/tools/checkpoint_tensors.py)

EOD = 256


def load(model_dir, dtype):
    hf = json.load(open(os.path.join(model_dir, "config.json")))
    if hf_moe_ref.is_hf_moe(model_dir):  # HF Mixtral / Qwen2-MoE / Qwen3-MoE: transformers' own forward (hf_moe_ref.py)
        cfg, tensors = hf_llama_ref.read_checkpoint(model_dir, gpt_ref.read_safetensors)
        return hf_moe_ref.HFMoEModel(cfg, tensors, dtype), hf_moe_ref.model_config(cfg)
    if hf_llama_ref.is_hf_llama(model_dir):  # HF Llama: config.json + model.safetensors or shards
        m = hf_llama_ref.model_config(hf)
        cfg, tensors = hf_llama_ref.read_checkpoint(model_dir, gpt_ref.read_safetensors)
        model = gpt_ref.build_model(m, dtype)
        model.load_state(hf_llama_ref.to_state(cfg, tensors, m))
        model.eval()
        return model, m
    m = {"num_layers": hf["n_layer"], "hidden_size": hf["n_embd"], "num_attention_heads": hf["n_head"],
         "ffn_hidden_size": hf.get("n_inner") or 4 * hf["n_embd"], "vocab_size": hf["vocab_size"],
         "max_position_embeddings": hf["n_positions"], "layernorm_epsilon": hf["layer_norm_epsilon"]}
    path = os.path.join(model_dir, "model.safetensors")
    model = gpt_ref.build_model(m, dtype)
    model.load_state(gpt_ref.hf_to_state(gpt_ref.read_safetensors(path), m, path))
    model.eval()
    return model, m


def load_checkpoint(path, dtype):
    """The reference model of a tptrain checkpoint, from its meta.json config and its global tensors."""
    d = checkpoint_tensors.iteration_dir(path)
    m = dict(json.load(open(os.path.join(d, "meta.json")))["config"]["model"])
    m["moe_expert_capacity_factor"] = None  # at inference every token gets its top-k experts
    model = gpt_ref.build_model(m, dtype)
    tensors = checkpoint_tensors.read_checkpoint(d)
    state = {}
    for name, p in model.named_parameters():
        if name not in tensors:
            raise SystemExit(f"greedy.py: {d} has no tensor {name}")
        t = tensors[name]
        if name in ("wte.weight", "lm_head.weight"):
            t = t[:m["vocab_size"]]  # the padded vocabulary's rows are no tokens
        state[name] = t.reshape(tuple(p.shape))  # the reference's 2-D views of the global shapes
    model.load_state(state)
    with torch.no_grad():  # the expert bias (aux-loss-free balancing): a buffer of the reference's MoE MLP
        for i, blk in enumerate(model.h):
            name = f"h.{i}.mlp.router.expert_bias"
            if getattr(blk.mlp, "moe", {}).get("expert_bias"):
                if name not in tensors:
                    raise SystemExit(f"greedy.py: {d} has no tensor {name}")
                blk.mlp.expert_bias.copy_(torch.from_numpy(tensors[name]))
    model.eval()
    return model, m


def check(model, m, text, prompt, max_new):
    """The one-line verdict on generate's output TEXT (bytes, a newline at the end); AssertionError if wrong."""
    assert text.endswith(b"\n"), "no newline at the end"
    toks = list(text[:-1])
    p = list(prompt.encode("utf-8"))
    assert toks[:len(p)] == p, "the output does not start with the prompt"
    new = len(toks) - len(p)
    P = m["max_position_embeddings"]
    fed = toks[:P]                                                 # the last of P + 1 tokens is never fed
    with torch.no_grad():
        logits = model(torch.tensor([fed]))[0].double()            # (T, V)
    worst, exact = 0.0, 0
    for i in range(len(p) - 1, len(toks) - 1):
        row, chosen = logits[i], toks[i + 1]
        gap = float(row.max() - row[chosen])
        worst = max(worst, gap)
        exact += int(torch.argmax(row)) == chosen
        assert gap <= 1e-4, f"token {i + 1} ({chosen}): {gap:.3g} below the best ({int(torch.argmax(row))})"
    nxt = int(torch.argmax(logits[-1])) if len(fed) == len(toks) else None
    stop = ("max-new-tokens" if new == max_new else "the positions" if len(toks) == P + 1
            else "the end-of-document token" if nxt == EOD else None)
    assert stop, f"generate stopped after {new} tokens, but the next best token is {nxt} and nothing stops there"
    return (f"{new} tokens, {exact} of them the argmax of {type(model).__name__}, the rest within {worst:.2g} of it;"
            f" stopped at {stop}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="directory with model.safetensors and config.json")
    src.add_argument("--checkpoint", help="a tptrain checkpoint.save directory or iter_N directory")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--float64", action="store_true")
    p.add_argument("--check", metavar="FILE", help="check generate's output FILE instead of generating")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    dtype = torch.float64 if a.float64 else torch.float32
    model, m = load_checkpoint(a.checkpoint, dtype) if a.checkpoint else load(a.model, dtype)
    if m["vocab_size"] != 257:
        sys.exit(f"greedy.py: vocab_size {m['vocab_size']}: the byte-level tokenizer needs 257")
    if a.check:
        try:
            print(check(model, m, open(a.check, "rb").read(), a.prompt, a.max_new_tokens))
        except AssertionError as e:
            sys.exit(f"greedy.py: {a.check}: {e}")
        return 0
    P = m["max_position_embeddings"]
    tokens = list(a.prompt.encode("utf-8")) or [EOD]
    out = []
    min_gap = float("inf")
    with torch.no_grad():
        while len(out) < a.max_new_tokens:
            logits = model(torch.tensor([tokens]))[0, -1]           # (V,)
            top2 = torch.topk(logits, 2).values
            min_gap = min(min_gap, float(top2[0] - top2[1]))
            nxt = int(torch.argmax(logits))                          # the first maximal index
            if nxt == EOD:
                break
            out.append(nxt)
            tokens.append(nxt)
            if len(tokens) > P:
                break
    sys.stdout.buffer.write(a.prompt.encode("utf-8") + bytes(out) + b"\n")
    print(f"greedy.py: {len(out)} new tokens; smallest gap between the two best logits {min_gap:.3g}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
