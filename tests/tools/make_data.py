#!/usr/bin/python3
"""Test helper for tptrain's token data (docs/ARCHITECTURE.md "Data formats"), independent of the C++ code.

  make_data.py check PREFIX --inputs FILE... [--json-key KEY] [--append-eod]
      Parses PREFIX.idx / PREFIX.bin as written by `tptrain preprocess` and checks them against the
      documents this script reads from the inputs itself (same rules as data/text_documents.h):
      header, uint16 dtype, one sequence per document, doc index 0..N, contiguous pointers,
      every byte value, EOD 256 after each document with --append-eod.
  make_data.py fixtures DIR
      Writes valid and corrupt datasets into DIR (see FIXTURES) and checks that each one is exactly
      what its name says, so the CLI tests that feed them to tptrain test the reader, not the fixture.
"""
import argparse
import json
import os
import struct
import sys

IDX_MAGIC = b"MMIDIDX\x00\x00"
LLMC_MAGIC = 20240520
EOD = 256


# ---------------------------------------------------------------------------------------------
# Documents of a preprocess input (mirror of data/text_documents.h)

def documents(path, json_key):
    data = open(path, "rb").read()
    if path.endswith(".json") or path.endswith(".jsonl"):
        docs = []
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            text = json.loads(line)[json_key].encode("utf-8")
            if text:
                docs.append(text)
        return docs
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()  # a final newline does not start another line
    fortune = any(line.rstrip() == b"%" for line in lines)

    def is_separator(line):
        return line.rstrip() == b"%" if fortune else not line.strip()

    docs, current = [], []
    for line in lines + [None]:
        if line is None or is_separator(line):
            text = b"\n".join(current)
            if current and text.strip():
                docs.append(text)
            current = []
        else:
            current.append(line)
    return docs


# ---------------------------------------------------------------------------------------------
# Megatron .idx/.bin parsing

def read_megatron(prefix):
    idx = open(prefix + ".idx", "rb").read()
    bin_ = open(prefix + ".bin", "rb").read()
    assert idx[:9] == IDX_MAGIC, "bad magic %r" % idx[:9]
    version, = struct.unpack_from("<Q", idx, 9)
    dtype, = struct.unpack_from("<B", idx, 17)
    nseq, ndoc = struct.unpack_from("<QQ", idx, 18)
    off = 34
    sizes = list(struct.unpack_from("<%di" % nseq, idx, off))
    off += 4 * nseq
    pointers = list(struct.unpack_from("<%dq" % nseq, idx, off))
    off += 8 * nseq
    doc_idx = list(struct.unpack_from("<%dq" % ndoc, idx, off))
    off += 8 * ndoc
    assert off == len(idx), "idx has %d bytes, header implies %d" % (len(idx), off)
    return dict(version=version, dtype=dtype, sizes=sizes, pointers=pointers, doc_idx=doc_idx, bin=bin_)


def check(args):
    expected = []
    for path in args.inputs:
        for text in documents(path, args.json_key):
            expected.append(list(text) + ([EOD] if args.append_eod else []))
    m = read_megatron(args.prefix)
    errors = []

    def expect(cond, what):
        if not cond:
            errors.append(what)

    expect(m["version"] == 1, "version %d != 1" % m["version"])
    expect(m["dtype"] == 8, "dtype code %d != 8 (uint16)" % m["dtype"])
    n = len(expected)
    expect(len(m["sizes"]) == n, "%d sequences, expected %d documents" % (len(m["sizes"]), n))
    expect(m["doc_idx"] == list(range(n + 1)), "doc index %s != 0..%d" % (m["doc_idx"][:10], n))
    pos = 0
    for i, (size, ptr) in enumerate(zip(m["sizes"], m["pointers"])):
        expect(ptr == pos, "pointer %d of sequence %d, expected %d" % (ptr, i, pos))
        tokens = list(struct.unpack_from("<%dH" % size, m["bin"], ptr))
        if i < n and tokens != expected[i]:
            at = next((k for k, (a, b) in enumerate(zip(tokens, expected[i])) if a != b), min(len(tokens), len(expected[i])))
            errors.append("document %d (%d tokens, expected %d): from token %d got %s, expected %s"
                          % (i, len(tokens), len(expected[i]), at, tokens[at:at + 8], expected[i][at:at + 8]))
        pos += 2 * size
    expect(len(m["bin"]) == pos, ".bin has %d bytes, sequences cover %d" % (len(m["bin"]), pos))
    total = sum(len(d) for d in expected)
    if errors:
        print("check %s: %d problem(s):\n  %s" % (args.prefix, len(errors), "\n  ".join(errors[:20])))
        return 1
    print("check %s: %d documents, %d tokens OK" % (args.prefix, n, total))
    return 0


# ---------------------------------------------------------------------------------------------
# Fixtures: name -> (files written, what must be wrong with them)

def idx_bytes(dtype, sizes, pointers, doc_idx, magic=IDX_MAGIC, version=1):
    b = magic + struct.pack("<QBQQ", version, dtype, len(sizes), len(doc_idx))
    b += struct.pack("<%di" % len(sizes), *sizes) + struct.pack("<%dq" % len(pointers), *pointers)
    return b + struct.pack("<%dq" % len(doc_idx), *doc_idx)


def llmc_bytes(tokens, declared=None, magic=LLMC_MAGIC):
    header = [0] * 256
    header[0], header[1], header[2] = magic, 1, len(tokens) if declared is None else declared
    return struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens)


# 3 documents of uint16 tokens < 64, 40 tokens in all: enough for samples of seq_length 8.
DOCS = [list(range(1, 11)), list(range(20, 35)), list(range(40, 55))]


def megatron_ok():
    sizes = [len(d) for d in DOCS]
    pointers = [2 * sum(sizes[:i]) for i in range(len(sizes))]
    bin_ = b"".join(struct.pack("<%dH" % len(d), *d) for d in DOCS)
    return sizes, pointers, list(range(len(DOCS) + 1)), bin_


def write_fixtures(out):
    os.makedirs(out, exist_ok=True)
    sizes, pointers, doc_idx, bin_ = megatron_ok()
    good_idx = idx_bytes(8, sizes, pointers, doc_idx)
    megatron = {
        # name: (idx bytes, bin bytes)
        "megatron_ok": (good_idx, bin_),
        "megatron_truncated_bin": (good_idx, bin_[: len(bin_) - 7]),
        "megatron_wrong_magic": (idx_bytes(8, sizes, pointers, doc_idx, magic=b"MMIDIDY\x00\x00"), bin_),
        "megatron_pointer_past_end": (idx_bytes(8, sizes, pointers[:-1] + [len(bin_) - 4], doc_idx), bin_),
        "megatron_truncated_idx": (good_idx[:-5], bin_),
    }
    for name, (idx, b) in megatron.items():
        open(os.path.join(out, name + ".idx"), "wb").write(idx)
        open(os.path.join(out, name + ".bin"), "wb").write(b)
    tokens = [t for d in DOCS for t in d]
    llmc = {
        "llmc_ok.bin": llmc_bytes(tokens),
        "llmc_count_too_large.bin": llmc_bytes(tokens, declared=len(tokens) + 100),
        "llmc_wrong_magic.bin": llmc_bytes(tokens, magic=20240521),
    }
    for name, b in llmc.items():
        open(os.path.join(out, name), "wb").write(b)
    verify_fixtures(out)


def verify_fixtures(out):
    """Each fixture is valid, or broken in exactly the way its name says."""
    p = lambda name: os.path.join(out, name)
    ok = read_megatron(p("megatron_ok"))
    assert ok["sizes"] == [len(d) for d in DOCS] and len(ok["bin"]) == 2 * sum(ok["sizes"])
    t = read_megatron(p("megatron_truncated_bin"))
    assert t["pointers"][-1] + 2 * t["sizes"][-1] > len(t["bin"])
    assert open(p("megatron_wrong_magic.idx"), "rb").read()[:9] != IDX_MAGIC
    e = read_megatron(p("megatron_pointer_past_end"))
    assert e["pointers"][-1] + 2 * e["sizes"][-1] > len(e["bin"]) and e["sizes"] == ok["sizes"]
    assert len(open(p("megatron_truncated_idx.idx"), "rb").read()) == 34 + 12 * 3 + 8 * 4 - 5
    for name, declared_ok in [("llmc_ok.bin", True), ("llmc_count_too_large.bin", False)]:
        b = open(p(name), "rb").read()
        magic, version, count = struct.unpack_from("<3i", b)
        assert magic == LLMC_MAGIC and version == 1
        assert (1024 + 2 * count == len(b)) == declared_ok and (1024 + 2 * count > len(b)) != declared_ok
    assert struct.unpack_from("<i", open(p("llmc_wrong_magic.bin"), "rb").read())[0] != LLMC_MAGIC
    print("fixtures in %s verified" % out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("prefix")
    c.add_argument("--inputs", nargs="+", required=True)
    c.add_argument("--json-key", default="text")
    c.add_argument("--append-eod", action="store_true")
    f = sub.add_parser("fixtures")
    f.add_argument("dir")
    args = ap.parse_args()
    if args.cmd == "check":
        return check(args)
    write_fixtures(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
