#!/usr/bin/python3
"""Compares two metrics JSON-lines files (tptrain's logging.metrics_file and gpt_ref.py --out).

  compare_metrics.py A.jsonl B.jsonl [--loss-abs 1e-4] [--gradnorm-rel 1e-3] [--lr-rel 1e-6]
                     [--aux-abs 1e-5] [--min-iters 8] [--names tptrain,ref]

Checks: both files have the same set of iterations, at least --min-iters of them; for every
iteration |lm_loss_A - lm_loss_B| <= loss-abs, |grad_norm_A - grad_norm_B| <= gradnorm-rel *
max(|A|, |B|), |lr_A - lr_B| <= lr-rel * max(|A|, |B|), consumed_samples equal where both have it,
and every value finite. The MoE balancing losses (docs/MOE.md: load_balancing_loss, global_load_balancing_loss,
seq_load_balancing_loss, z_loss): where either file has one at an iteration, both must, within
aux-abs; moe_max_imbalance within aux-abs where both have it. Prints a per-iteration table and the largest differences.
Exit 0 if all pass, 1 on a mismatch, 2 if a file cannot be read.
"""
import argparse
import json
import math
import sys

AUX_KEYS = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss")  # both sides or neither
MOE_KEYS = AUX_KEYS + ("moe_max_imbalance",)                            # compared within --aux-abs


def load(path):
    """{iteration: merged record}; lines without 'iteration' (or without lm_loss, e.g. eval-only) skipped."""
    recs = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}")
            if not isinstance(r, dict) or "iteration" not in r:
                continue
            recs.setdefault(int(r["iteration"]), {}).update(r)
    return {k: v for k, v in recs.items() if "lm_loss" in v}


def rel(a, b):
    d = abs(a - b)
    scale = max(abs(a), abs(b))
    return 0.0 if d == 0 else (d / scale if scale > 0 else math.inf)


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def compare_moe(ra, rb, na, nb, tol, worst):
    """The MoE values of one iteration's records: the problems found; worst[key] = (largest |d|, it)."""
    bad = []
    for key in MOE_KEYS:
        x, y = ra.get(key), rb.get(key)
        if x is None and y is None:
            continue
        if x is None or y is None:
            if key in AUX_KEYS:
                bad.append(f"{key} only in {na if y is None else nb}")
            continue
        if not (finite(x) and finite(y)):
            bad.append(f"{key} not finite ({x!r}, {y!r})")
            continue
        d = abs(x - y)
        if key not in worst or d > worst[key][0]:
            worst[key] = (d, ra["iteration"])
        if d > tol:
            bad.append(f"{key} |diff| {d:.3e} > {tol:g} ({na} {x!r}, {nb} {y!r})")
    return bad


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--loss-abs", type=float, default=1e-4)
    p.add_argument("--gradnorm-rel", type=float, default=1e-3)
    p.add_argument("--lr-rel", type=float, default=1e-6)
    p.add_argument("--aux-abs", type=float, default=1e-5, help="absolute tolerance of the MoE values")
    p.add_argument("--min-iters", type=int, default=8)
    p.add_argument("--names", default="A,B", help="column labels, e.g. tptrain,ref")
    a = p.parse_args(argv)
    na, nb = (a.names.split(",") + ["B"])[:2]
    try:
        A, B = load(a.a), load(a.b)
    except (OSError, ValueError) as e:
        print(f"compare_metrics: cannot read: {e}")
        return 2
    problems = []
    ka, kb = set(A), set(B)
    if ka != kb:
        problems.append(f"iterations differ: only in {na}: {sorted(ka - kb)[:10]}, only in {nb}: {sorted(kb - ka)[:10]}")
    common = sorted(ka & kb)
    if len(common) < a.min_iters:
        problems.append(f"only {len(common)} common iterations, need >= {a.min_iters}")
    worst = {"lm_loss": (0.0, None), "grad_norm": (0.0, None), "lr": (0.0, None)}
    hdr = (f"{'iter':>5} | {'loss ' + na:>14} {'loss ' + nb:>14} {'|d|':>9} | {'gnorm ' + na:>13} "
           f"{'gnorm ' + nb:>13} {'rel':>9} | {'lr ' + na:>11} {'lr ' + nb:>11} {'rel':>8} |")
    print(hdr)
    print("-" * len(hdr))
    for k in common:
        ra, rb = A[k], B[k]
        bad = []
        vals = {}
        for key in ("lm_loss", "grad_norm", "lr"):
            x, y = ra.get(key), rb.get(key)
            if not (finite(x) and finite(y)):
                bad.append(f"{key} not finite/missing ({x!r}, {y!r})")
                vals[key] = (x, y, math.inf)
                continue
            d = abs(x - y) if key == "lm_loss" else rel(x, y)
            vals[key] = (x, y, d)
            if d > worst[key][0] or worst[key][1] is None:
                worst[key] = (d, k)
        if vals["lm_loss"][2] > a.loss_abs:
            bad.append(f"lm_loss |diff| {vals['lm_loss'][2]:.3e} > {a.loss_abs:g}")
        if vals["grad_norm"][2] > a.gradnorm_rel:
            bad.append(f"grad_norm rel diff {vals['grad_norm'][2]:.3e} > {a.gradnorm_rel:g}")
        if vals["lr"][2] > a.lr_rel:
            bad.append(f"lr rel diff {vals['lr'][2]:.3e} > {a.lr_rel:g}")
        if "consumed_samples" in ra and "consumed_samples" in rb and ra["consumed_samples"] != rb["consumed_samples"]:
            bad.append(f"consumed_samples {ra['consumed_samples']} != {rb['consumed_samples']}")
        bad += compare_moe(ra, rb, na, nb, a.aux_abs, worst)

        def num(v, fmt):
            return format(v, fmt) if finite(v) else str(v)
        l, g, r = vals["lm_loss"], vals["grad_norm"], vals["lr"]
        print(f"{k:>5} | {num(l[0], '14.8f')} {num(l[1], '14.8f')} {num(l[2], '9.2e')} | "
              f"{num(g[0], '13.7f')} {num(g[1], '13.7f')} {num(g[2], '9.2e')} | "
              f"{num(r[0], '11.4e')} {num(r[1], '11.4e')} {num(r[2], '8.1e')} | {'ok' if not bad else 'MISMATCH'}")
        problems += [f"iteration {k}: {b}" for b in bad]
    for key in MOE_KEYS:
        if key in worst:
            print(f"largest |d| {key}: {worst[key][0]:.3e} (iteration {worst[key][1]}), tolerance {a.aux_abs:g}")
    print(f"largest differences: lm_loss |d| {worst['lm_loss'][0]:.3e} (iteration {worst['lm_loss'][1]}), "
          f"grad_norm rel {worst['grad_norm'][0]:.3e} (iteration {worst['grad_norm'][1]}), "
          f"lr rel {worst['lr'][0]:.3e} (iteration {worst['lr'][1]}); "
          f"tolerances {a.loss_abs:g} / {a.gradnorm_rel:g} / {a.lr_rel:g}")
    if problems:
        for pr in problems[:20]:
            print(f"MISMATCH: {pr}")
        if len(problems) > 20:
            print(f"... and {len(problems) - 20} more")
        return 1
    print(f"compare_metrics: OK, {len(common)} iterations match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
