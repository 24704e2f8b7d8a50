#!/usr/bin/env bash
# logging.trace_file and the plot scripts: short traced runs (PP2 x DP2 with 1F1B, TP2 x PP2 with
# GPipe) whose traces hold every (stage, micro-batch) forward and backward exactly once per rank and
# iteration, in an order the schedule allows (forward of a micro-batch before its backward, micro-
# batches in order, 1F1B's in-flight bound min(PP - stage, M), GPipe's all forwards first); then
# scripts/plot_schedule (whose legend names every category drawn) and scripts/plot_metrics (with
# validation loss; its first point is iteration 1) write non-empty PNGs.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1

$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 20000 --docs 40 --seed 2 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 2, global_batch_size: 16, train_iters: 6, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2}
data: {path: $W/data, split: [90, 10, 0], eval_interval: 2, eval_iters: 1}
logging: {log_interval: 4}
YAML

# name np tp pp schedule: M = 16 / (2 * DP) micro-batches per DP rank
runs="pp2dp2:4:1:2:1f1b:4 tp2pp2:4:2:2:gpipe:8"
for r in $runs; do
  IFS=: read -r name np tp pp sched M <<< "$r"
  if timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.tensor_model_parallel_size=$tp \
      --set parallel.pipeline_model_parallel_size=$pp --set parallel.pipeline_schedule=$sched \
      --set logging.trace_file="$W/$name.trace.json" --set logging.metrics_file="$W/$name.jsonl" \
      > "$W/$name.log" 2>&1 && grep -q "trace: wrote" "$W/$name.log"; then
    ok "traced run $name (TP $tp x PP $pp, $sched)"
  else bad "traced run $name"; tail -10 "$W/$name.log"; continue; fi
  if out=$($PY - "$W/$name.trace.json" "$pp" "$M" 6 "$sched" "$np" <<'PY'
import json, sys
from collections import defaultdict
path, P, M, iters, sched, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
ev = json.load(open(path))["traceEvents"]
spans = [e for e in ev if e.get("ph") == "X"]
named = {e["pid"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
ranks = sorted({e["pid"] for e in spans})
assert ranks == list(range(world)), f"ranks in the trace: {ranks}"
assert named == set(ranks), "every rank needs its process_name (one track per rank)"
seqs = defaultdict(dict)  # stage -> rank -> [(iteration, actions)]
for r in ranks:
    mine = [e for e in spans if e["pid"] == r]
    stage = {e["args"]["stage"] for e in mine}
    assert len(stage) == 1, f"rank {r} has stages {stage}"
    stage = stage.pop()
    bound = min(P - stage, M) if sched == "1f1b" else M
    its = sorted({e["args"]["iteration"] for e in mine})
    assert its == list(range(1, iters + 1)), f"rank {r}: iterations {its}"
    for it in its:
        acts = [e for e in sorted(mine, key=lambda e: e["ts"]) if e["args"]["iteration"] == it and e["cat"] in ("forward", "backward")]
        names = [e["name"] for e in acts]
        fw = [int(n[1:]) for n in names if n[0] == "F"]
        bw = [int(n[1:]) for n in names if n[0] == "B"]
        assert fw == list(range(M)) and bw == list(range(M)), f"rank {r} it {it}: {names}"  # each once, in order
        done_f, in_flight, peak = set(), 0, 0
        for n in names:
            mb = int(n[1:])
            if n[0] == "F":
                done_f.add(mb); in_flight += 1
            else:
                assert mb in done_f, f"rank {r} it {it}: backward of {mb} before its forward: {names}"
                in_flight -= 1
            peak = max(peak, in_flight)
        assert peak == bound, f"rank {r} (stage {stage}) it {it}: {peak} micro-batches in flight, the {sched} bound is {bound}: {names}"
        if sched == "gpipe":
            assert names == [f"F{i}" for i in range(M)] + [f"B{i}" for i in range(M)], names
        assert all(e["dur"] >= 0 for e in acts)
        seqs[stage].setdefault(r, []).append(names)
    comm = [e for e in mine if e["cat"] == "comm"]
    assert comm, f"rank {r}: no send/recv spans"
    for cat in ("allreduce", "optimizer"):  # one gradient reduction and one update per iteration
        n = sorted(e["args"]["iteration"] for e in mine if e["cat"] == cat)
        assert n == list(range(1, iters + 1)), f"rank {r}: {cat} spans in iterations {n}"
for stage, by_rank in seqs.items():
    first = next(iter(by_rank.values()))
    assert all(v == first for v in by_rank.values()), f"stage {stage}: ranks differ in their action order"
print(f"  {len(spans)} spans, {world} ranks, {P} stages x {M} micro-batches x {iters} iterations; "
      f"stage 0 order: {' '.join(seqs[0][min(seqs[0])][0])}")
PY
  ); then ok "$name trace: every forward and backward once per rank and iteration, in $sched order"; echo "$out"
  else bad "$name trace"; echo "$out"; fi
done

grep -q '"val_lm_loss"' "$W/pp2dp2.jsonl" && ok "metrics file has validation losses" || bad "no val_lm_loss in the metrics"
# logged: iteration 1 (where the loss starts), every log_interval (4), every eval_interval (2), the last (6)
its=$($PY -c 'import json, sys; print(" ".join(str(json.loads(l)["iteration"]) for l in open(sys.argv[1])))' "$W/pp2dp2.jsonl")
[ "$its" = "1 2 4 6" ] && ok "metrics logged at iterations $its" || bad "metrics logged at iterations '$its', want 1 2 4 6"

png_ok() {  # file min_bytes: PNG signature, size, and an IHDR of at least 300 x 200 pixels
  $PY - "$1" "$2" <<'PY'
import os, struct, sys
p, least = sys.argv[1], int(sys.argv[2])
b = open(p, "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
assert len(b) >= least, f"{len(b)} bytes"
w, h = struct.unpack(">II", b[16:24])
assert w >= 300 and h >= 200, (w, h)
print(f"{os.path.basename(p)}: {w} x {h} pixels, {len(b)} bytes")
PY
}
for name in pp2dp2 tp2pp2; do
  if $PY "$TPTRAIN_SRC/scripts/plot_schedule" "$W/$name.trace.json" -o "$W/$name.schedule.png" > "$W/plot_$name.log" 2>&1 &&
     info=$(png_ok "$W/$name.schedule.png" 10000); then
    ok "plot_schedule: $info ($(cat "$W/plot_$name.log"))"
  else bad "plot_schedule $name"; cat "$W/plot_$name.log"; fi
  # the legend names every category drawn (the last iteration's spans, the op profile's apart): the
  # gradient reduction and the optimizer step too, each under its own label
  if out=$($PY - "$W/$name.trace.json" "$W/plot_$name.log" <<'PY'
import json, re, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
spans = [e for e in ev if e.get("ph") == "X" and e.get("cat") != "op"]
last = max(e["args"]["iteration"] for e in spans)
cats = {e["cat"] for e in spans if e["args"]["iteration"] == last}
m = re.search(r"legend: (.*)\)$", open(sys.argv[2]).read().strip())
legend = dict(x.split(" = ", 1) for x in m.group(1).split("; ")) if m else {}
ok = set(legend) == cats and {"allreduce", "optimizer"} <= cats and len(set(legend.values())) == len(legend)
print(("legend: " + ", ".join(sorted(legend))) if ok else "drawn %s, legend %r" % (sorted(cats), legend))
sys.exit(0 if ok else 1)
PY
); then ok "plot_schedule $name: $out"
  else bad "plot_schedule $name legend: $out"; fi
done
$PY "$TPTRAIN_SRC/scripts/plot_schedule" "$W/pp2dp2.trace.json" --all -o "$W/all.png" > "$W/plot_all.log" 2>&1 &&
  info=$(png_ok "$W/all.png" 10000) && ok "plot_schedule --all: $info" || { bad "plot_schedule --all"; cat "$W/plot_all.log"; }
if $PY "$TPTRAIN_SRC/scripts/plot_metrics" "$W/pp2dp2.jsonl" -o "$W/metrics.png" > "$W/plot_metrics.log" 2>&1 &&
   info=$(png_ok "$W/metrics.png" 20000); then
  ok "plot_metrics: $info ($(cat "$W/plot_metrics.log"))"
else bad "plot_metrics"; cat "$W/plot_metrics.log"; fi
$PY "$TPTRAIN_SRC/scripts/plot_metrics" "$W/pp2dp2.jsonl" "$W/tp2pp2.jsonl" --loss-only -o "$W/loss.png" > "$W/plot_loss.log" 2>&1 &&
  info=$(png_ok "$W/loss.png" 10000) && ok "plot_metrics of two runs, --loss-only: $info" || { bad "plot_metrics two runs"; cat "$W/plot_loss.log"; }

# bad input: exit 2 with a message
$PY "$TPTRAIN_SRC/scripts/plot_schedule" "$W/missing.json" > "$W/bad1.log" 2>&1
[ $? -eq 2 ] && grep -q "cannot read" "$W/bad1.log" && ok "plot_schedule of a missing file: exit 2" || { bad "plot_schedule missing"; cat "$W/bad1.log"; }
$PY "$TPTRAIN_SRC/scripts/plot_metrics" "$W/cfg.yaml" > "$W/bad2.log" 2>&1
[ $? -eq 2 ] && grep -q "not a JSON object" "$W/bad2.log" && ok "plot_metrics of a non-JSONL file: exit 2" || { bad "plot_metrics bad"; cat "$W/bad2.log"; }

finish
