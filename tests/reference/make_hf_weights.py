#!/usr/bin/python3
"""Writes a random GPT-2 in Hugging Face safetensors layout (Conv1D weights [in, out]).

  make_hf_weights.py --out W.safetensors --layers 2 --hidden 64 --heads 4 --vocab 97 --positions 16 \
                     [--ffn 256] [--std 0.02] [--seed 1] [--dtype f32|f16|bf16] [--prefix]

--prefix names tensors "transformer.*" and adds the HF causal-mask buffers h.{i}.attn.bias and
h.{i}.attn.masked_bias, which loaders must ignore. LayerNorm weights are 1 + noise and every bias and
LayerNorm bias is non-zero noise, so that a layout or transposition bug changes the loss.
"""
import argparse
import json
import struct
import sys

import numpy as np


def f32_to_bf16_bits(x):
    """Round-to-nearest-even fp32 -> bf16, returned as uint16 bit patterns (no NaNs expected)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def encode(arr, dtype):
    """Returns (safetensors dtype name, little-endian bytes)."""
    if dtype == "f32":
        return "F32", np.ascontiguousarray(arr, dtype="<f4").tobytes()
    if dtype == "f16":
        return "F16", np.ascontiguousarray(arr, dtype=np.float32).astype("<f2").tobytes()
    if dtype == "bf16":
        return "BF16", f32_to_bf16_bits(arr).astype("<u2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype="f32", dtypes=None, metadata=None):
    """tensors: ordered {name: numpy array}; dtypes: optional {name: dtype} overriding `dtype`."""
    header = {}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        st_dtype, raw = encode(arr, (dtypes or {}).get(name, dtype))
        header[name] = {"dtype": st_dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = dict(metadata or {"format": "pt"})
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad the header with spaces to a multiple of 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def make_gpt2(layers, hidden, vocab, positions, ffn=None, std=0.02, seed=1):
    """Random HF GPT-2 tensors (float32, HF names without prefix), in HF's order."""
    C, L = hidden, layers
    Fh = ffn or 4 * C
    rng = np.random.default_rng(seed)

    def normal(shape, s):
        return rng.normal(0.0, s, size=shape).astype(np.float32)

    t = {"wte.weight": normal((vocab, C), std), "wpe.weight": normal((positions, C), std)}
    proj_std = std / np.sqrt(2.0 * L)
    for i in range(L):
        h = f"h.{i}."
        t[h + "ln_1.weight"] = (1.0 + normal((C,), 0.1)).astype(np.float32)
        t[h + "ln_1.bias"] = normal((C,), 0.05)
        t[h + "attn.c_attn.weight"] = normal((C, 3 * C), std)
        t[h + "attn.c_attn.bias"] = normal((3 * C,), 0.05)
        t[h + "attn.c_proj.weight"] = normal((C, C), proj_std)
        t[h + "attn.c_proj.bias"] = normal((C,), 0.02)
        t[h + "ln_2.weight"] = (1.0 + normal((C,), 0.1)).astype(np.float32)
        t[h + "ln_2.bias"] = normal((C,), 0.05)
        t[h + "mlp.c_fc.weight"] = normal((C, Fh), std)
        t[h + "mlp.c_fc.bias"] = normal((Fh,), 0.05)
        t[h + "mlp.c_proj.weight"] = normal((Fh, C), proj_std)
        t[h + "mlp.c_proj.bias"] = normal((C,), 0.02)
    t["ln_f.weight"] = (1.0 + normal((C,), 0.1)).astype(np.float32)
    t["ln_f.bias"] = normal((C,), 0.05)
    return t


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--positions", type=int, required=True)
    p.add_argument("--ffn", type=int, default=None, help="MLP width (default 4 * hidden)")
    p.add_argument("--std", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    p.add_argument("--prefix", action="store_true", help='"transformer." names plus attn.bias buffers')
    a = p.parse_args(argv)
    if a.hidden % a.heads:
        p.error("--hidden must be divisible by --heads")
    t = make_gpt2(a.layers, a.hidden, a.vocab, a.positions, a.ffn, a.std, a.seed)
    out, dtypes = {}, {}
    for name, arr in t.items():
        out[("transformer." if a.prefix else "") + name] = arr
        if a.prefix and name.endswith("ln_1.weight"):  # HF buffers next to each block's attention
            blk = "transformer." + name[:-len("ln_1.weight")]
            out[blk + "attn.bias"] = np.tril(np.ones((a.positions, a.positions), np.float32))[None, None]
            out[blk + "attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
            dtypes[blk + "attn.bias"] = dtypes[blk + "attn.masked_bias"] = "f32"
    write_safetensors(a.out, out, a.dtype, dtypes)
    n = sum(v.size for k, v in t.items())
    print(f"make_hf_weights: wrote {a.out}: {len(out)} tensors, {n} parameters, {a.dtype}"
          f"{', transformer. prefix' if a.prefix else ''}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
