#!/usr/bin/env python3
"""Compares the metrics files (JSON lines) of two tptrain runs iteration by iteration.

usage: compare_runs.py REFERENCE OTHER [--rel 1e-5] [--keys lm_loss,grad_norm] [--min-iters 8]
Exit 0 when every iteration of REFERENCE is in OTHER and every key agrees within --rel
(relative to the reference value); prints the largest difference of each key.
"""
import argparse
import json
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                j = json.loads(line)
                rows[j["iteration"]] = j
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reference")
    ap.add_argument("other")
    ap.add_argument("--rel", type=float, default=1e-5)
    ap.add_argument("--keys", default="lm_loss,grad_norm")
    ap.add_argument("--min-iters", type=int, default=8)
    a = ap.parse_args()
    ref, oth = load(a.reference), load(a.other)
    if len(ref) < a.min_iters:
        print(f"FAIL: {a.reference} has {len(ref)} iterations, need >= {a.min_iters}")
        return 1
    if sorted(ref) != sorted(oth):
        print(f"FAIL: iterations differ: {sorted(ref)} vs {sorted(oth)}")
        return 1
    ok = True
    for key in a.keys.split(","):
        worst, at = 0.0, None
        for it in sorted(ref):
            r, o = ref[it][key], oth[it][key]
            rel = abs(r - o) / max(abs(r), 1e-30)
            if rel > worst:
                worst, at = rel, it
        status = "ok" if worst <= a.rel else "FAIL"
        ok &= worst <= a.rel
        print(f"  {key}: max relative difference {worst:.2e} (iteration {at}) {status}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
