#!/usr/bin/env python3
"""Pipeline bubble from a tptrain trace (logging.trace_file).

usage: bubble.py TRACE.json [--skip-first N]
For each iteration the window is from the first action's start to the last action's end over all
ranks; a stage's bubble is the share of the window its ranks spend outside forward and backward
compute. Prints the mean per stage and the 1F1B formula (PP - 1) / (M + PP - 1).
"""
import argparse
import json
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip-first", type=int, default=1, help="iterations to skip (warm-up)")
    a = ap.parse_args()
    # the schedule's own spans only (gradient reduction and optimizer spans are outside the pipeline)
    ev = [e for e in json.load(open(a.trace))["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") in ("forward", "backward", "comm")]
    by_iter = defaultdict(list)
    for e in ev:
        by_iter[e["args"]["iteration"]].append(e)
    iters = sorted(by_iter)[a.skip_first:]
    stages = sorted({e["args"]["stage"] for e in ev})
    P = len(stages)
    M = max(int(e["name"][1:]) for e in ev if e["cat"] == "forward") + 1
    bubble = defaultdict(list)
    for it in iters:
        es = by_iter[it]
        t0 = min(e["ts"] for e in es)
        t1 = max(e["ts"] + e["dur"] for e in es)
        busy = defaultdict(float)
        ranks = defaultdict(set)
        for e in es:
            ranks[e["args"]["stage"]].add(e["pid"])
            if e["cat"] in ("forward", "backward"):
                busy[e["args"]["stage"]] += e["dur"]
        for s in stages:
            per_rank_busy = busy[s] / len(ranks[s])
            bubble[s].append(1.0 - per_rank_busy / (t1 - t0))
    print(f"PP = {P}, M = {M}, iterations measured: {len(iters)}")
    for s in stages:
        v = bubble[s]
        print(f"  stage {s}: idle / total = {sum(v) / len(v):.3f}")
    allv = [x for s in stages for x in bubble[s]]
    print(f"  mean over stages: {sum(allv) / len(allv):.3f}")
    print(f"  1F1B formula (PP-1)/(M+PP-1) = {(P - 1) / (M + P - 1):.3f}")


if __name__ == "__main__":
    main()
