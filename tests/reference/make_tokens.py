#!/usr/bin/python3
"""Writes one token stream in both formats tptrain reads, so they can be compared:

  (a) a Megatron indexed dataset PREFIX.bin / PREFIX.idx (several documents of varying lengths,
      one sequence per document, dtype u16 = code 8 by default), and
  (b) an llm.c shard (256 x int32 header: magic 20240520, version 1, token count; uint16 tokens)
      holding the same stream as one document.

  make_tokens.py --vocab 97 --megatron PREFIX --llmc SHARD.bin --tokens 1225 --docs 7 \
                 [--pattern random|markov] [--seed 1] [--megatron-dtype u16|i32]

--pattern markov makes a learnable stream (each token mostly follows from the previous one), so a
few training steps visibly lower the loss; random is uniform.
"""
import argparse
import struct
import sys

import numpy as np

MEGATRON_CODES = {"u8": (1, np.uint8), "i32": (4, np.int32), "i64": (5, np.int64), "u16": (8, np.uint16)}


def make_stream(n, vocab, pattern="markov", seed=1):
    rng = np.random.default_rng(seed)
    if pattern == "random":
        return rng.integers(0, vocab, size=n, dtype=np.int64)
    if pattern == "markov":
        nxt = rng.integers(0, vocab, size=vocab)          # a fixed successor for every token
        out = np.empty(n, dtype=np.int64)
        out[0] = rng.integers(0, vocab)
        noise = rng.random(n) < 0.25
        rand = rng.integers(0, vocab, size=n)
        for i in range(1, n):
            out[i] = rand[i] if noise[i] else nxt[out[i - 1]]
        return out
    raise ValueError(pattern)


def doc_lengths(n, docs, seed=1):
    """`docs` positive lengths summing to n, deliberately uneven."""
    if docs > n:
        raise ValueError("more documents than tokens")
    rng = np.random.default_rng(seed + 1000)
    w = rng.random(docs) + 0.2
    lengths = np.maximum(1, np.floor(w / w.sum() * n).astype(np.int64))
    lengths[-1] += n - lengths.sum()
    while lengths[-1] < 1:  # give back from the longest
        j = int(np.argmax(lengths[:-1]))
        lengths[j] -= 1
        lengths[-1] += 1
    return lengths


def write_megatron(prefix, stream, lengths, dtype="u16"):
    code, np_dt = MEGATRON_CODES[dtype]
    data = stream.astype(np.dtype(np_dt).newbyteorder("<"))
    with open(prefix + ".bin", "wb") as f:
        f.write(data.tobytes())
    sizes = np.asarray(lengths, dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype("<i8") * data.itemsize
    doc_index = np.arange(len(lengths) + 1, dtype="<i8")  # one sequence per document
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_index.tobytes())


def write_llmc(path, stream):
    if stream.max(initial=0) > 65535:
        raise ValueError("llm.c shards hold uint16 tokens")
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = 20240520, 1, len(stream)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(stream.astype("<u2").tobytes())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--tokens", type=int, required=True, help="length of the whole stream")
    p.add_argument("--docs", type=int, default=7, help="Megatron documents")
    p.add_argument("--megatron", help="output prefix for .bin/.idx")
    p.add_argument("--megatron-dtype", choices=sorted(MEGATRON_CODES), default="u16")
    p.add_argument("--llmc", help="output llm.c shard")
    p.add_argument("--pattern", choices=["random", "markov"], default="markov")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if not (a.megatron or a.llmc):
        p.error("give --megatron and/or --llmc")
    stream = make_stream(a.tokens, a.vocab, a.pattern, a.seed)
    lengths = doc_lengths(a.tokens, a.docs, a.seed)
    if a.megatron:
        write_megatron(a.megatron, stream, lengths, a.megatron_dtype)
    if a.llmc:
        write_llmc(a.llmc, stream)
    print(f"make_tokens: {a.tokens} tokens < {a.vocab} ({a.pattern}), Megatron docs {lengths.tolist()}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
