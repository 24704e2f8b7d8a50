#!/usr/bin/python3
"""Independent check of `tptrain data --json` for a blend (data.path: [w1, p1, w2, p2, ...]).

usage: blend_ref.py --json OUT.jsonl --seq S --split a,b,c --weights w1,w2,... --prefixes p1,p2,...
                    [--shuffled]

Reads the .idx/.bin of every prefix with numpy, splits the documents as Megatron does, and
recomputes for every line of OUT.jsonl (one global sample of the train split):
  dataset, dataset_sample  from the blending greedy written from its definition (megatron-core
                           build_blending_indices: argmax_d w_d * max(i, 1) - count_d, first wins;
                           weights normalised with numpy.sum as megatron-core's normalize() does),
  tokens                   the first 16 of the component's sample (S + 1 tokens of its train stream),
  documents                the corpus documents those S + 1 tokens touch.
Without --shuffled the component's sample is dataset_sample mod its number of samples (no
shuffle); with it the sample is taken from tptrain's component_sample (the permutation is
tptrain's own generator) and only checked to be in range and from the right epoch.
"""
import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def read_megatron(prefix):
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    dtype = DTYPES[idx[17]]
    nseq, ndoc = struct.unpack_from("<QQ", idx, 18)
    sizes = np.frombuffer(idx, np.int32, nseq, 34)
    pointers = np.frombuffer(idx, np.int64, nseq, 34 + 4 * nseq)
    doc_idx = np.frombuffer(idx, np.int64, ndoc, 34 + 12 * nseq)
    binary = np.fromfile(prefix + ".bin", dtype=dtype)
    item = np.dtype(dtype).itemsize
    seqs = [binary[p // item: p // item + n].astype(np.int64) for p, n in zip(pointers, sizes)]
    return [np.concatenate(seqs[doc_idx[d]:doc_idx[d + 1]]) if doc_idx[d + 1] > doc_idx[d] else np.zeros(0, np.int64)
            for d in range(ndoc - 1)]


def megatron_split(n, weights):
    w = [float(x) for x in weights] + [0.0] * (3 - len(weights))
    s = sum(w)
    idx = [0]
    for x in w:
        idx.append(idx[-1] + int(round(x / s * float(n))))
    diff = idx[-1] - n
    idx = [idx[0]] + [i - diff for i in idx[1:]]
    return idx[0], idx[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--split", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--prefixes", required=True)
    ap.add_argument("--shuffled", action="store_true")
    a = ap.parse_args()
    S = a.seq
    raw = np.array([float(x) for x in a.weights.split(",")], dtype=np.float64)
    w = (raw / np.sum(raw)).tolist()                      # megatron-core normalize()
    comps = []
    for prefix in a.prefixes.split(","):
        docs = read_megatron(prefix)
        b, e = megatron_split(len(docs), a.split.split(","))
        lengths = [len(d) for d in docs[b:e]]
        starts = np.concatenate([[0], np.cumsum(lengths)])
        stream = np.concatenate(docs[b:e])
        comps.append(dict(first=b, starts=starts, stream=stream, samples=(len(stream) - 1) // S))
    rows = [json.loads(line) for line in open(a.json) if line.strip()]
    if not rows:
        sys.exit("blend_ref: no samples in " + a.json)
    counts = [0] * len(w)
    bad = 0
    next_i = 0
    for r in rows:
        i = r["sample"]
        while next_i <= i:                                # the greedy, from its definition
            x = max(float(next_i), 1.0)
            errors = [w[d] * x - counts[d] for d in range(len(w))]
            d = max(range(len(w)), key=lambda k: (errors[k], -k))
            ds, dss = d, counts[d]
            counts[d] += 1
            next_i += 1
        c = comps[ds]
        sample = dss % c["samples"]
        if a.shuffled:
            if not (0 <= r["component_sample"] < c["samples"]) or r["epoch"] != dss // c["samples"]:
                bad += 1
            sample = r["component_sample"]
        t0 = sample * S
        tokens = c["stream"][t0:t0 + 16].tolist()
        d_first = int(np.searchsorted(c["starts"], t0, side="right") - 1)
        d_last = int(np.searchsorted(c["starts"], t0 + S, side="right") - 1)
        documents = list(range(c["first"] + d_first, c["first"] + d_last + 1))
        want = dict(dataset=ds, dataset_sample=dss, tokens=tokens, documents=documents)
        got = {k: r[k] for k in want}
        if got != want:
            bad += 1
            if bad <= 5:
                print(f"sample {i}: tptrain {got}\n           reference {want}")
    share = ", ".join(f"{c}" for c in counts)
    print(f"blend_ref: {len(rows)} samples, {len(w)} components (drawn: {share}), {bad} mismatches")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
