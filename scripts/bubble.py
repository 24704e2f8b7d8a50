#!/usr/bin/env python3
"""Pipeline bubble from a tptrain trace (logging.trace_file).

usage: bubble.py TRACE.json [--skip-first N]
For each iteration the window is from the first action's start to the last action's end over all
ranks; a stage's bubble is the share of the window its ranks spend outside forward and backward
compute (the spans named F<mb>, B<mb> and W<mb>, with c<chunk> after the micro-batch for model chunks
other than 0: interleaved 1F1B, ZB-H1's weight-gradient W). Prints the mean per stage and the
formula of the schedule with F = B = W: 1F1B (PP - 1) / (M + PP - 1); interleaved with v chunks
(PP - 1) / (v M + PP - 1); ZB-H1 (PP - 1) / (3 M + PP - 1).
"""
import argparse
import json
import re
from collections import defaultdict

COMPUTE = re.compile(r"^([FBW])(\d+)(?:c(\d+))?$")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip-first", type=int, default=1, help="iterations to skip (warm-up)")
    a = ap.parse_args()
    # the schedule's own spans only (gradient reduction and optimizer spans are outside the pipeline)
    ev = [e for e in json.load(open(a.trace))["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") in ("forward", "backward", "weight", "comm")]
    by_iter = defaultdict(list)
    for e in ev:
        by_iter[e["args"]["iteration"]].append(e)
    iters = sorted(by_iter)[a.skip_first:]
    stages = sorted({e["args"]["stage"] for e in ev})
    P = len(stages)
    compute = [(e, COMPUTE.match(e["name"])) for e in ev]
    compute = [(e, m) for e, m in compute if m]
    M = max(int(m.group(2)) for e, m in compute if m.group(1) == "F") + 1
    chunks = max(int(m.group(3) or 0) for e, m in compute) + 1
    split = any(m.group(1) == "W" for e, m in compute)
    bubble = defaultdict(list)
    for it in iters:
        es = by_iter[it]
        t0 = min(e["ts"] for e in es)
        t1 = max(e["ts"] + e["dur"] for e in es)
        busy = defaultdict(float)
        ranks = defaultdict(set)
        for e in es:
            ranks[e["args"]["stage"]].add(e["pid"])
            if COMPUTE.match(e["name"]):
                busy[e["args"]["stage"]] += e["dur"]
        for s in stages:
            per_rank_busy = busy[s] / len(ranks[s])
            bubble[s].append(1.0 - per_rank_busy / (t1 - t0))
    print(f"PP = {P}, M = {M}, chunks per rank v = {chunks}{', split backward (B, W)' if split else ''}, "
          f"iterations measured: {len(iters)}")
    for s in stages:
        v = bubble[s]
        print(f"  stage {s}: idle / total = {sum(v) / len(v):.3f}")
    allv = [x for s in stages for x in bubble[s]]
    print(f"  mean over stages: {sum(allv) / len(allv):.3f}")
    per_iter = sorted(sum(bubble[s][i] for s in stages) / P for i in range(len(iters)))
    print(f"  median over iterations of the stages' mean: {per_iter[len(per_iter) // 2]:.3f} "
          f"(range {per_iter[0]:.3f} .. {per_iter[-1]:.3f})")
    print(f"  1F1B formula (PP-1)/(M+PP-1) = {(P - 1) / (M + P - 1):.3f}")
    if chunks > 1:
        print(f"  interleaved formula (PP-1)/(v*M+PP-1) = {(P - 1) / (chunks * M + P - 1):.3f}")
    if split:
        print(f"  ZB-H1 formula with F = B = W (PP-1)/(3*M+PP-1) = {(P - 1) / (3 * M + P - 1):.3f}")


if __name__ == "__main__":
    main()
