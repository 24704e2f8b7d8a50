#!/usr/bin/python3
"""llm.c's Llama 3 token shards next to the equivalent Megatron dataset, for tests/cli/llmc_llama3.sh.

  make_llmc_llama3.py --vocab 128256 --tokens 6000 --shards 3 --llmc DIR/tok_ --megatron PREFIX [--seed 1]
      [--version 7] [--token-at I:V]

Writes DIR/tok_000.bin, DIR/tok_001.bin, ... exactly as llm.c's dev/data/data_common.py
write_datafile(filename, toks, "llama-3") does (256 x int32 header: magic 20240801, version 7,
token count; then the tokens as uint32), one slice of one token stream each, and PREFIX.bin /
PREFIX.idx: a Megatron int32 dataset (dtype code 4) with one document per shard holding the same
tokens. The stream is tests/reference/make_tokens.py's learnable Markov stream, with at least a
third of its tokens above 65535. --version writes another version number into the shards (a bad
file); --token-at I:V puts token V at position I of the first shard only. Prints the stream as
JSON (for the check of the samples tptrain reads) to stdout when --print-stream is given.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokens  # noqa: E402


def write_llmc_llama3(path, toks, version=7):
    header = np.zeros(256, dtype=np.int32)
    header[0] = 20240801
    header[1] = version
    header[2] = len(toks)
    with open(path, "wb") as f:
        f.write(header.astype("<i4").tobytes())
        f.write(np.asarray(toks, dtype="<u4").tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--llmc", required=True, help="shard path prefix: PREFIX000.bin, PREFIX001.bin, ...")
    p.add_argument("--megatron", help="Megatron int32 dataset prefix")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--version", type=int, default=7)
    p.add_argument("--token-at", help="I:V")
    p.add_argument("--print-stream", action="store_true")
    a = p.parse_args()
    stream = make_tokens.make_stream(a.tokens, a.vocab, "markov", a.seed)
    assert (stream > 65535).mean() > 0.3 or a.vocab < 100000
    lengths = make_tokens.doc_lengths(a.tokens, a.shards, a.seed)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    shards = [stream[bounds[i]:bounds[i + 1]].copy() for i in range(a.shards)]
    if a.token_at:
        i, v = (int(x) for x in a.token_at.split(":"))
        shards[0][i] = v
    for i, s in enumerate(shards):
        write_llmc_llama3(f"{a.llmc}{i:03d}.bin", s, a.version)
    if a.megatron:
        make_tokens.write_megatron(a.megatron, np.concatenate(shards), [len(s) for s in shards], "i32")
    if a.print_stream:
        print(json.dumps(np.concatenate(shards).tolist()))
    print(f"make_llmc_llama3: {a.tokens} tokens < {a.vocab} in {a.shards} shards of {lengths.tolist()} tokens "
          f"({(stream > 65535).sum()} above 65535)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
