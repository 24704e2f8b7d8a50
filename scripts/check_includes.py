#!/usr/bin/env python3
"""The include direction of docs/ARCHITECTURE.md "Layers": every `#include "..."` of a library folder
names a file of its own folder or of a folder below it.

    apps  ->  train  ->  plan     ->  model  ->  parallel  ->  core
                     ->  interop  ->
              train  ->  data     ->  core

plan and interop are side by side (neither includes the other), data knows nothing of the model or
of ranks. Inside core the two backends, core/cpu and core/cuda, include core and themselves, never
each other, and core's own files include neither (model code reaches a backend through core/ops.h).
tests/ and scripts/ may include anything and are not checked.

Usage: check_includes.py [--root DIR]   (default: the repository holding this script)
Prints each offending include as `file:line: ...` and exits 1 when there is one, else 0.
"""
import argparse
import os
import re
import sys

# What each unit may include (besides itself); a unit is a top folder, or core's backend subfolder.
CORE = {"core", "core/cpu", "core/cuda"}
ALLOWED = {
    "core": {"core"},
    "core/cpu": {"core/cpu", "core"},
    "core/cuda": {"core/cuda", "core"},
    "parallel": {"parallel"} | CORE,
    "model": {"model", "parallel"} | CORE,
    "plan": {"plan", "model", "parallel"} | CORE,
    "interop": {"interop", "model", "parallel"} | CORE,
    "data": {"data"} | CORE,
    "train": {"train", "plan", "interop", "model", "parallel", "data"} | CORE,
    "apps": {"apps", "train", "plan", "interop", "model", "parallel", "data"} | CORE,
}
LAYERS = ["apps", "train", "plan", "interop", "model", "parallel", "data", "core"]
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def unit_of(path):
    """The unit of a repository-relative path ("core/cuda/attention/x.cu" -> "core/cuda"), or None."""
    parts = path.split("/")
    if parts[0] not in ALLOWED or len(parts) < 2:
        return None
    if parts[0] == "core" and len(parts) > 2 and parts[1] in ("cpu", "cuda"):
        return "core/" + parts[1]
    return parts[0]


def check(root):
    problems = []
    for layer in LAYERS:
        top = os.path.join(root, layer)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                unit = unit_of(rel)
                with open(full, encoding="utf-8", errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        target = inc
                        if unit_of(inc) is None:
                            # a name relative to the including file (the compiler's first place to look)
                            beside = os.path.normpath(os.path.join(os.path.dirname(rel), inc)).replace(os.sep, "/")
                            if os.path.isfile(os.path.join(root, beside)):
                                target = beside
                        got = unit_of(target)
                        if got is None:
                            problems.append(f'{rel}:{n}: includes "{inc}", which is not a file of a library folder '
                                            f'({", ".join(LAYERS)}): name it from the repository root')
                        elif got not in ALLOWED[unit]:
                            problems.append(f'{rel}:{n}: includes "{inc}" ({got}), but {unit} may include only '
                                            f'{", ".join(sorted(ALLOWED[unit]))} (docs/ARCHITECTURE.md "Layers")')
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.root, "core")):
        print(f"check_includes: {args.root} has no core/ folder (not a tptrain tree)", file=sys.stderr)
        return 2
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_includes: {len(problems)} include(s) against the layer order", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
