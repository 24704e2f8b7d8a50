#!/usr/bin/env python3
"""The step-time model against published runs (tests/plan/published.yaml; docs/PLAN.md).

For each row not marked skip: `tptrain plan` on the row's model, GPUs, layout and batch must estimate
the published throughput within +-20 % (the worst row is printed), and `tptrain plan --search` on the
row's model, GPU count and batch must list the published layout (re-estimated with the search's DP
overlaps, so no slower), list the layouts fastest first, and rank first a layout that `tptrain plan`,
given the search's --set arguments for it, estimates at the search's step time and memory, within
the search's memory limit; a NeMo FP8 row's layout with no memory option beyond FP8 parameters (NeMo's FP8
recipe keeps them). A skipped MoE row's layout must still be listed by a search given the memory
its plan needs (issue 39: the search over EP).
usage: published_check.py TPTRAIN published.yaml WORKDIR [--no-search]"""
import json, os, subprocess, sys, time
import yaml

tptrain, table, work = sys.argv[1:4]
do_search = "--no-search" not in sys.argv
rows = yaml.safe_load(open(table))["rows"]
errors, worst, skipped = [], (0.0, ""), []
unmodelled = {}  # skipped MoE rows by model, GPUs, batch and GPU: their layouts checked in one search each


def flops(kind, B, m):
    s, l, h, V = m["seq_length"], m["num_layers"], m["hidden_size"], m["vocab_size"]
    if kind == "sc21":
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if kind == "mcore":
        return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    raise ValueError(kind)


def run(args):
    out = subprocess.run([tptrain] + args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("tptrain %s: exit %d: %s" % (" ".join(args), out.returncode, out.stderr.strip()[-400:]))
    return json.loads(out.stdout)


def listed(s, lay, cp, sp, dist, ep):
    """The search's layouts that are the row's published one (an MoE row's with ETP 1, as it is planned here)."""
    return [x for x in s["layouts"] if (x["tp"], x["cp"], x["pp"], x["virtual_stages"], x["micro_batch_size"], x["recompute"],
            x["sequence_parallel"], x["distributed_optimizer"], x["pipeline_schedule"], x.get("ep", 1)) ==
            (lay["tp"], cp, lay["pp"], lay["v"], lay["micro_batch_size"], lay["recompute"], sp, dist, "1f1b", ep)
            and (ep == 1 or x.get("etp") == 1)]


for row in rows:
    name = row["name"]
    moe = "num_moe_experts" in row["model"]
    if row.get("skip") and not (moe and do_search):
        skipped.append("%s (%s)" % (name, row["skip"]))
        continue
    lay, gpus = row["layout"], row["gpus"]
    cp = lay.get("cp", 1)
    dp = gpus // (lay["tp"] * cp * lay["pp"])
    sp, dist = bool(lay.get("sequence_parallel", False)), bool(lay.get("distributed_optimizer", False))
    ep = lay.get("ep", 1)
    overlap = row["source"].startswith(("mcore", "nemo"))  # Megatron-Core and NeMo overlap the DP communication
    cfg = {
        "model": dict(row["model"], make_vocab_size_divisible_by=128),
        "parallel": {"tensor_model_parallel_size": lay["tp"], "pipeline_model_parallel_size": lay["pp"],
                     "context_parallel_size": cp, **({"expert_model_parallel_size": ep, "expert_tensor_parallel_size": 1} if "num_moe_experts" in row["model"] else {}),
                     "virtual_pipeline_model_parallel_size": lay["v"] if lay["v"] > 1 else None,
                     "sequence_parallel": sp, "distributed_optimizer": dist,
                     "overlap_grad_reduce": overlap and dp * cp > 1, "overlap_param_gather": overlap and dist},
        "training": {"micro_batch_size": lay["micro_batch_size"], "global_batch_size": row["global_batch_size"],
                     "train_iters": 1, "precision": lay["precision"], "recompute": lay["recompute"],
                     **({"recompute_modules": lay["recompute_modules"]} if "recompute_modules" in lay else {}),
                     **({"fp8_format": lay["fp8"], "fp8_recipe": "delayed"} if "fp8" in lay else {})},
        "data": {"path": "none"},  # the plan needs no data
    }
    path = os.path.join(work, name + ".yaml")
    yaml.safe_dump(cfg, open(path, "w"))
    try:
        p = run(["plan", "--config", path, "--world-size", str(gpus), "--gpu", row["gpu"], "--json"])
    except RuntimeError as e:
        errors.append("%s: %s" % (name, e))
        continue
    step = p["step_time_s"]
    if "num_moe_experts" in row["model"] and not p["fits"]:  # it ran on those GPUs: the plan must fit them
        errors.append("%s: the published layout plans %.1f GiB, more than the %s's %.0f GiB it ran on" % (
            name, max(st["total_bytes"] for st in p["stages"]) / 2**30, row["gpu"], p["device_memory_bytes"] / 2**30))
    if row.get("skip"):  # an MoE row not modelled yet: the search still lists its layout where it fits
        skipped.append("%s (%s)" % (name, row["skip"]))
        key = json.dumps([row["model"], gpus, row["global_batch_size"], row["gpu"]], sort_keys=True)
        unmodelled.setdefault(key, []).append((name, path, row["gpu"], gpus, (lay, cp, sp, dist, ep), step,
                                               max(st["total_bytes"] for st in p["stages"])))
        continue
    if "tflops_per_gpu" in row:
        est = flops(row["flops"], row["global_batch_size"], row["model"]) / step / gpus / 1e12
        pub, unit = row["tflops_per_gpu"], "TFLOP/s per GPU"
    else:
        est, pub, unit = 1 / step, 1 / row["step_time_s"], "steps/s"
    err = est / pub - 1
    fit = "fits" if p["fits"] else "does NOT fit %.0f GiB" % (p["device_memory_bytes"] / 2**30)
    print("%-18s estimate %8.4g vs published %8.4g %s: %+6.1f%% (step %.4g s, MFU %.1f%%, %s)" % (
        name, est, pub, unit, 100 * err, step, 100 * p["mfu"], fit))
    if abs(err) > abs(worst[0]):
        worst = (err, name)
    if abs(err) > 0.20:
        errors.append("%s: estimate %+.1f%% off the published figure (more than 20 %%)" % (name, 100 * err))
    if not do_search:
        continue
    t0 = time.time()
    try:
        memory = ["--device-memory-gib", str(row["search_device_memory_gib"])] if "search_device_memory_gib" in row else []
        s = run(["plan", "--config", path, "--search", "--gpus", str(gpus), "--gpu", row["gpu"], "--json", "--top", "0"] + memory)
    except RuntimeError as e:
        errors.append("%s --search: %s" % (name, e))
        continue
    seconds = time.time() - t0
    mine = listed(s, lay, cp, sp, dist, ep)
    if not s["layouts"] or len(mine) != 1:
        errors.append("%s --search: the published layout is not among the %d layouts that fit" % (name, len(s["layouts"])))
        continue
    best, pub_in_search = s["layouts"][0], mine[0]
    # NeMo's FP8 recipe keeps FP8 parameters (fp8_params / Megatron's --fp8-param-gather; NeMo 2's
    # bf16_with_fp8_mixed): its layouts fit with at most the search's exact options (" +P8"), none that
    # rounds the gradients or the moments
    if row["source"].startswith("nemo-fp8") and pub_in_search["memory_options"] > 1:
        errors.append("%s --search: the published layout needs %s, more than FP8 parameters" % (name, pub_in_search["layout"]))
    if pub_in_search["time"]["step_time_s"] > step * (1 + 1e-9):
        errors.append("%s --search: the published layout estimated %.6g s in the search, %.6g s by plan (the search "
                      "turns on DP overlaps: it may only be faster)" % (name, pub_in_search["time"]["step_time_s"], step))
    # The search's ranking against the plain plan: the list is fastest first, and its first layout,
    # selected by the search's own --set arguments, gets from `tptrain plan` the step time and the
    # per-stage memory the search claims, within the search's memory limit.
    times = [x["time"]["step_time_s"] for x in s["layouts"]]
    if any(b < a for a, b in zip(times, times[1:])):
        errors.append("%s --search: the layouts are not listed fastest first" % name)
    try:
        sets = [a for kv in best["set"] for a in ("--set", kv)]
        q = run(["plan", "--config", path, "--world-size", str(gpus), "--gpu", row["gpu"], "--json"] + memory + sets)
    except RuntimeError as e:
        errors.append("%s --search: its first layout %s: %s" % (name, best["layout"], e))
        continue
    if abs(q["step_time_s"] / best["time"]["step_time_s"] - 1) > 1e-9:
        errors.append("%s --search: the first layout %s estimated %.6g s in the search, %.6g s by plan" % (
            name, best["layout"], best["time"]["step_time_s"], q["step_time_s"]))
    peak = max(st["total_bytes"] for st in q["stages"])
    if peak != best["peak_bytes"] or peak > s["usable_memory_fraction"] * s["device_memory_bytes"]:
        errors.append("%s --search: the first layout %s needs %d bytes by plan, %d in the search (limit %.0f)" % (
            name, best["layout"], peak, best["peak_bytes"], s["usable_memory_fraction"] * s["device_memory_bytes"]))
    print("%-18s search: %d of %d layouts fit, published layout #%d (%s); best %s: %.4g s (%.2fx the published layout's "
          "estimate) in %.1f s" % ("", s["layouts_fit"], s["layouts_valid"], pub_in_search["rank"], pub_in_search["layout"], best["layout"],
                                   best["time"]["step_time_s"], pub_in_search["time"]["step_time_s"] / best["time"]["step_time_s"],
                                   seconds))

# The skipped MoE rows: one search per model, GPU count and batch (on the rows' GPU, its memory) lists
# each row's published layout as `tptrain plan` plans it.
for group in unmodelled.values():
    name, path, gpu, gpus = group[0][:4]
    try:
        s = run(["plan", "--config", path, "--search", "--gpus", str(gpus), "--gpu", gpu, "--json", "--top", "0"])
    except RuntimeError as e:
        errors.append("%s --search: %s" % (name, e))
        continue
    for name, _, _, _, layout, step, peak in group:
        mine = listed(s, *layout)
        if len(mine) != 1 or mine[0]["time"]["step_time_s"] > step * (1 + 1e-9) or mine[0]["peak_bytes"] != peak:
            errors.append("%s --search: the published layout is not listed once as `tptrain plan` plans it" % name)
        else:
            print("%-18s skipped; the search lists its layout #%d of %d" % (name, mine[0]["rank"], len(s["layouts"])))

for s in skipped:
    print("skipped: " + s)
print("worst row: %s %+.1f%%" % (worst[1], 100 * worst[0]))
print("; ".join(errors) if errors else "all rows within 20 %")
sys.exit(1 if errors else 0)
