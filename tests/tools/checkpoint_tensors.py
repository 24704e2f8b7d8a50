#!/usr/bin/env python3
"""Reads tptrain checkpoints (docs/ARCHITECTURE.md "Checkpoint format") into full global tensors.

A checkpoint directory iter_N/ holds meta.json and safetensors shards (model_tpXX_ppYYY[_dpZZZ],
optim_tpXX_ppYYY_dpZZZ). meta.json's "files" index lists, per file, every box it holds of a global
tensor: name, global_shape, box_offset, box_size and, when a file holds several boxes of one tensor
(the distributed optimizer's flat blocks), the safetensors "key" (name#1, name#2, ...). The boxes of
a tensor are disjoint and cover it exactly; this reader checks that, and that each stored tensor's
shape is its box's size, then assembles every tensor.

usage:
  checkpoint_tensors.py list CKPT [--kind model|optim|all]
  checkpoint_tensors.py compare REFERENCE OTHER [--rel 1e-5] [--kind model|optim|all]

CKPT: a checkpoint.save directory (its latest_checkpointed_iteration.txt picks iter_N) or one
iter_N directory. compare: the same tensor names and shapes, and for each tensor
||a - b|| / ||a|| (Frobenius, as tests/tools/compare_params.py) <= --rel (--rel 0: bitwise equal);
prints the worst tensor; exit 0 when all agree, 1 otherwise (2 for an unreadable checkpoint).

As a module: read_checkpoint(path, kind="model") -> {name: numpy array (global shape, float32)}.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

KIND_PREFIX = {"model": ("model_",), "optim": ("optim_",), "all": ("model_", "optim_")}


class CheckpointError(Exception):
    pass


def iteration_dir(path):
    """The iter_N directory of PATH (an iter_N directory itself, or a save directory's latest)."""
    if os.path.isfile(os.path.join(path, "meta.json")):
        return path
    latest = os.path.join(path, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(latest):
        raise CheckpointError(f"{path}: neither meta.json nor latest_checkpointed_iteration.txt")
    it = int(open(latest).read().strip())
    d = os.path.join(path, f"iter_{it:07d}")
    if not os.path.isfile(os.path.join(d, "meta.json")):
        raise CheckpointError(f"{d}: no meta.json (latest iteration {it})")
    return d


def _bf16_to_f32(raw):
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path):
    """{key: numpy array} of a safetensors file (F32, F16, BF16, F64)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            a = _bf16_to_f32(raw)
        elif dt == "F64":
            a = np.frombuffer(raw, dtype="<f8")
        else:
            raise CheckpointError(f"{path}: {key}: dtype {dt} not read here")
        out[key] = a.reshape(info["shape"])
    return out


def read_checkpoint(path, kind="model"):
    """Every global tensor of the checkpoint at PATH whose file is of KIND (model, optim or all)."""
    d = iteration_dir(path)
    meta = json.load(open(os.path.join(d, "meta.json")))
    if meta.get("format") != "tptrain-checkpoint":
        raise CheckpointError(f"{d}/meta.json: format {meta.get('format')!r}, not tptrain-checkpoint")
    tensors, filled = {}, {}
    for fname in sorted(meta["files"]):
        if not fname.startswith(KIND_PREFIX[kind]):
            continue
        stored = read_safetensors(os.path.join(d, fname))
        for t in meta["files"][fname]["tensors"]:
            name, shape = t["name"], tuple(t["global_shape"])
            off, size = t["box_offset"], t["box_size"]
            key = t.get("key", name)
            if key not in stored:
                raise CheckpointError(f"{fname}: no tensor {key} (box of {name})")
            box = stored[key]
            if tuple(box.shape) != tuple(size):
                raise CheckpointError(f"{fname}: {key} has shape {list(box.shape)}, its box {size}")
            if len(off) != len(shape) or any(o < 0 or o + s > g for o, s, g in zip(off, size, shape)):
                raise CheckpointError(f"{fname}: {key}: box {off} + {size} outside {list(shape)}")
            if name not in tensors:
                tensors[name] = np.zeros(shape, dtype=np.float32)
                filled[name] = np.zeros(shape, dtype=np.int32)
            elif tensors[name].shape != shape:
                raise CheckpointError(f"{name}: global shapes {list(tensors[name].shape)} and {list(shape)}")
            sl = tuple(slice(o, o + s) for o, s in zip(off, size))
            tensors[name][sl] = box
            filled[name][sl] += 1
    for name, f in filled.items():
        if f.size and (f.min() != 1 or f.max() != 1):
            raise CheckpointError(f"{name}: boxes cover elements {int(f.min())} to {int(f.max())} times, "
                                  f"not exactly once ({int((f == 0).sum())} of {f.size} uncovered)")
    if not tensors:
        raise CheckpointError(f"{d}: no {kind} tensors")
    return tensors


def compare(ref, oth, rel):
    """(ok, lines) for two {name: array} dicts."""
    if sorted(ref) != sorted(oth):
        return False, [f"FAIL: tensor names differ: {sorted(set(ref) ^ set(oth))}"]
    lines, ok, worst, where, bitwise = [], True, 0.0, None, 0
    for name in sorted(ref):
        x, y = ref[name].astype(np.float64), oth[name].astype(np.float64)
        if x.shape != y.shape:
            lines.append(f"FAIL: {name}: shapes {list(x.shape)} vs {list(y.shape)}")
            ok = False
            continue
        if not np.isfinite(y).all():
            lines.append(f"FAIL: {name}: not finite")
            ok = False
            continue
        bitwise += bool(np.array_equal(ref[name], oth[name]))
        d = np.linalg.norm(x - y)
        r = d / max(np.linalg.norm(x), 1e-30) if d else 0.0
        if r > rel:
            lines.append(f"FAIL: {name}: relative difference {r:.2e} > {rel:g}")
            ok = False
        if r > worst or where is None:
            worst, where = r, name
    lines.append(f"  tensors: {len(ref)} ({bitwise} bitwise equal), max relative difference "
                 f"{worst:.2e} ({where}) {'ok' if ok else 'FAIL'}")
    return ok, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="names and global shapes of the assembled tensors")
    ls.add_argument("checkpoint")
    ls.add_argument("--kind", choices=sorted(KIND_PREFIX), default="model")
    cp = sub.add_parser("compare", help="compare two checkpoints tensor by tensor")
    cp.add_argument("reference")
    cp.add_argument("other")
    cp.add_argument("--rel", type=float, default=1e-5)
    cp.add_argument("--kind", choices=sorted(KIND_PREFIX), default="model")
    a = ap.parse_args()
    try:
        if a.cmd == "list":
            t = read_checkpoint(a.checkpoint, a.kind)
            for name in t:
                print(f"{name} {list(t[name].shape)} norm {np.linalg.norm(t[name].astype(np.float64)):.6g}")
            return 0
        ref, oth = read_checkpoint(a.reference, a.kind), read_checkpoint(a.other, a.kind)
    except (CheckpointError, OSError, KeyError, ValueError) as e:
        print(f"FAIL: {e}")
        return 2
    ok, lines = compare(ref, oth, a.rel)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
