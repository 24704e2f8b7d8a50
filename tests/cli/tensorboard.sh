#!/usr/bin/env bash
# logging.tensorboard_dir and --config - (standard input). TensorBoard's own reader (the `tensorboard`
# package, fetched from PyPI into a cache under the build directory; the test skips with a message
# where PyPI is unreachable) reads the event file of a PP 2 run (written by the last stage, rank 1),
# with every record's CRC checked, and finds each scalar at each logged iteration equal to
# metrics.jsonl's value in float32; a run killed with -9 leaves a file readable up to the last
# flush; a resume writes a second event file. `tptrain --config - < cfg.yaml` trains as `--config
# cfg.yaml` (same losses) alone and under mpirun -np 2; /dev/zero and a FIFO as --config exit 2.
# Auxiliary outputs on a full disk (/dev/full; a 64 KiB tmpfs when it may mount, as root): one
# warning each, the run and its checkpoint complete, the metrics lines and TFRecords whole.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1

$PY "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 20000 --docs 40 --seed 2 \
  --megatron "$W/data" >/dev/null 2>&1 || { echo "FAIL: make_tokens.py"; echo "0 passed, 1 failed"; exit 1; }
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 6, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_iters: 6}
data: {path: $W/data, split: [90, 10, 0], eval_interval: 2, eval_iters: 1}
logging: {log_interval: 1}
YAML

# --- --config - (no TensorBoard needed) ---
if timeout 120 "$TPTRAIN" --config "$W/cfg.yaml" --set logging.metrics_file="$W/file1.jsonl" > "$W/file1.log" 2>&1 &&
   timeout 120 "$TPTRAIN" --config - --set logging.metrics_file="$W/stdin1.jsonl" < "$W/cfg.yaml" > "$W/stdin1.log" 2>&1 &&
   [ "$(grep -o '"lm_loss":[^,]*' "$W/file1.jsonl")" = "$(grep -o '"lm_loss":[^,]*' "$W/stdin1.jsonl")" ] &&
   [ "$(grep -c lm_loss "$W/stdin1.jsonl")" = 6 ]; then
  ok "--config - trains as --config FILE (same losses, 1 rank)"
else bad "--config - on 1 rank"; tail -5 "$W/stdin1.log"; fi
if timeout 300 mpirun -np 2 "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.pipeline_model_parallel_size=2 \
     --set logging.metrics_file="$W/file2.jsonl" > "$W/file2.log" 2>&1 &&
   timeout 300 mpirun -np 2 "$TPTRAIN" --config - --set parallel.pipeline_model_parallel_size=2 \
     --set logging.metrics_file="$W/stdin2.jsonl" < "$W/cfg.yaml" > "$W/stdin2.log" 2>&1 &&
   [ "$(grep -o '"lm_loss":[^,]*' "$W/file2.jsonl")" = "$(grep -o '"lm_loss":[^,]*' "$W/stdin2.jsonl")" ] &&
   [ "$(grep -c lm_loss "$W/stdin2.jsonl")" = 6 ]; then
  ok "--config - under mpirun -np 2 (rank 0 reads, every rank parses the same text)"
else bad "--config - under mpirun -np 2"; tail -5 "$W/stdin2.log"; fi
timeout 60 "$TPTRAIN" --config /dev/zero > "$W/zero.log" 2>&1; rc=$?
[ $rc -eq 2 ] && ok "--config /dev/zero exits 2" || { bad "--config /dev/zero exited $rc"; tail -3 "$W/zero.log"; }
mkfifo "$W/fifo"
timeout 60 "$TPTRAIN" --config "$W/fifo" > "$W/fifo.log" 2>&1; rc=$?
[ $rc -eq 2 ] && ok "--config FIFO exits 2" || { bad "--config FIFO exited $rc"; tail -3 "$W/fifo.log"; }
timeout 120 "$TPTRAIN" --config - < /dev/zero > "$W/zero_stdin.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "larger than 16 MiB" "$W/zero_stdin.log" && ok "--config - < /dev/zero exits 2 (16 MiB)" ||
  { bad "--config - < /dev/zero exited $rc"; tail -3 "$W/zero_stdin.log"; }
timeout 60 "$TPTRAIN" --config - <&- > "$W/closed_stdin.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "standard input is closed" "$W/closed_stdin.log" &&
  ok "--config - with standard input closed exits 2 saying so (not fd 0 reused by another file)" ||
  { bad "--config - <&- exited $rc"; tail -3 "$W/closed_stdin.log"; }
timeout 60 "$TPTRAIN" --config - < /dev/null > "$W/empty_stdin.log" 2>&1; rc=$?
[ $rc -eq 2 ] && ! grep -q "standard input is closed" "$W/empty_stdin.log" && ok "--config - < /dev/null exits 2 (an empty config, not 'closed')" ||
  { bad "--config - < /dev/null exited $rc"; tail -3 "$W/empty_stdin.log"; }
printf 'model: [1\n' | timeout 60 mpirun -np 2 "$TPTRAIN" --config - > "$W/bad_stdin.log" 2>&1; rc=$?
[ $rc -eq 2 ] && ok "a bad config on standard input exits 2 under mpirun" || { bad "bad stdin config exited $rc"; tail -3 "$W/bad_stdin.log"; }

# --- auxiliary outputs on a full disk (train/aux_output.h): one warning per output naming the file,
# that output stops, training and its checkpoint go on; what was written is whole records ---
timeout 120 "$TPTRAIN" --config "$W/cfg.yaml" --set logging.metrics_file=/dev/full --set checkpoint.save="$W/ck_devfull" \
  > "$W/devfull.log" 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c "logging.metrics_file: writing '/dev/full' failed: No space left on device" "$W/devfull.log")" = 1 ] &&
   [ -d "$W/ck_devfull/iter_0000006" ]; then ok "metrics_file /dev/full: one warning, 6 iterations and the checkpoint, exit 0"
else bad "metrics_file /dev/full (exit $rc)"; grep -i "warn\|error" "$W/devfull.log" | head -5; fi
mkdir -p "$W/full"
if mount -t tmpfs -o size=64k tmpfs "$W/full" 2>/dev/null; then
  trap 'umount "$W/full" 2>/dev/null' EXIT
  dd if=/dev/zero of="$W/full/filler" bs=4096 count=14 2>/dev/null  # 2 pages of 16 left: one each
  timeout 300 "$TPTRAIN" --config "$W/cfg.yaml" --set training.train_iters=40 --set optimizer.lr_decay_iters=40 \
    --set logging.metrics_file="$W/full/m.jsonl" --set logging.tensorboard_dir="$W/full/tb" \
    --set logging.trace_file="$W/full/trace.json" --set checkpoint.save="$W/ck_full" > "$W/full.log" 2>&1; rc=$?
  n_warn=$(grep -c "failed: No space left on device; this output stops here" "$W/full.log")
  if [ $rc -eq 0 ] && [ -d "$W/ck_full/iter_0000040" ] && grep -q "iteration       40/      40" "$W/full.log" &&
     [ "$(grep -c "logging.metrics_file: writing '$W/full/m.jsonl' failed" "$W/full.log")" = 1 ] &&
     [ "$(grep -c "logging.tensorboard_dir: writing '$W/full/tb/events.out.tfevents" "$W/full.log")" = 1 ] &&
     grep -q "logging.trace_file: writing '$W/full/trace.json.rank0' failed" "$W/full.log" &&
     ! grep -q "trace: wrote" "$W/full.log" && [ ! -e "$W/full/trace.json" ] && [ ! -e "$W/full/trace.json.rank0" ] && [ "$n_warn" -ge 2 ] &&
     $PY -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]  # every line whole
assert 0 < len(rows) < 40 and [r['iteration'] for r in rows] == list(range(1, len(rows) + 1)), len(rows)
print(len(rows))" "$W/full/m.jsonl" > "$W/full_rows.txt"; then
    ok "a full disk under metrics, TensorBoard and trace: one warning each, 40 iterations and the checkpoint, exit 0; metrics.jsonl $(cat "$W/full_rows.txt") whole lines"
  else bad "full disk (exit $rc)"; grep -i "warn\|error" "$W/full.log" | head -8; fi
  FULL_TB="$W/full/tb"
else
  echo "SKIP the full-disk case: cannot mount a tmpfs here (needs root); the /dev/full case ran"
  FULL_TB=
fi

# --- TensorBoard's reader, from PyPI into a cache under the build directory ---
TB_CACHE="$(dirname "$W")/tensorboard_py"
if ! PYTHONPATH="$TB_CACHE" $PY -c "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator" 2>/dev/null; then
  rm -rf "$TB_CACHE"
  timeout 180 $PY -m pip install --quiet --disable-pip-version-check --no-deps --target "$TB_CACHE" \
    tensorboard protobuf absl-py six > "$W/pip.log" 2>&1
fi
if ! PYTHONPATH="$TB_CACHE" $PY -c "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator" 2>/dev/null; then
  echo "SKIP the TensorBoard reader checks: could not fetch the tensorboard package from PyPI (pip install --target $TB_CACHE failed; no network?):"
  tail -3 "$W/pip.log" 2>/dev/null
  finish; exit $?
fi
export PYTHONPATH="$TB_CACHE"
CHECK="$W/check_tb.py"
cat > "$CHECK" <<'PY'
# check_tb.py DIR METRICS [--files N] [--prefix]: every event file in DIR (N of them) read by
# TensorBoard's EventAccumulator; every scalar at every iteration of METRICS equal in float32.
# --prefix: METRICS may hold iterations past the last event (a killed run): compare the common ones.
import glob, json, math, os, sys
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
d, metrics = sys.argv[1], sys.argv[2]
nfiles = int(sys.argv[sys.argv.index("--files") + 1]) if "--files" in sys.argv else 1
prefix = "--prefix" in sys.argv
files = sorted(glob.glob(os.path.join(d, "events.out.tfevents.*")))
assert len(files) == nfiles, f"{len(files)} event files in {d}, want {nfiles}: {files}"
rows = [json.loads(l) for l in open(metrics)]
ev = {}
for f in files:
    ea = EventAccumulator(f, size_guidance={"scalars": 0})
    ea.Reload()
    assert ea.file_version == 2.0, f"file_version {ea.file_version} in {f}"
    for tag in ea.Tags()["scalars"]:
        for e in ea.Scalars(tag):
            assert (tag, e.step) not in ev, f"{tag} twice at step {e.step}"
            ev[(tag, e.step)] = e.value
steps = sorted({s for (_, s) in ev})
f32 = lambda x: float(np.float32(x))
if prefix:  # killed between the event and the metrics line, or the other way round: the common steps
    assert steps and steps == list(range(1, steps[-1] + 1)), f"steps {steps}"
    last = min(steps[-1], rows[-1]["iteration"])
    assert last >= len(rows) - 1, f"the event file stops at step {steps[-1]}, metrics.jsonl at {rows[-1]['iteration']}"
    rows = [r for r in rows if r["iteration"] <= last]
    steps = [s for s in steps if s <= last]
assert steps == [r["iteration"] for r in rows], f"event steps {steps} != metrics iterations {[r['iteration'] for r in rows]}"
n = 0
for r in rows:
    k = r["iteration"]
    want = {"lm loss": r["lm_loss"], "learning-rate": r["lr"], "grad-norm": r["grad_norm"],
            "loss-scale": r["loss_scale"], "iteration-time": r["elapsed_ms"] / 1000.0,
            "throughput": r["tokens_per_s"], "batch-size": 8}
    if "val_lm_loss" in r:
        want["lm loss validation"] = r["val_lm_loss"]
        want["lm loss validation ppl"] = math.exp(min(r["val_lm_loss"], 20.0))
    else:
        assert ("lm loss validation", k) not in ev, f"validation loss at {k} but none in metrics"
    for tag, v in want.items():
        got = ev.get((tag, k))
        assert got is not None, f"no {tag!r} at step {k}"
        tol = 1e-6 * abs(v) if tag.endswith("ppl") else 0.0  # exp: libm and Python may differ by an ulp
        assert abs(got - f32(v)) <= tol, f"{tag!r} at step {k}: event {got!r} != metrics {v!r} (float32 {f32(v)!r})"
        n += 1
    assert ev.get(("mem-allocated-bytes", k), 0) > 0, f"mem-allocated-bytes at {k}"
    if "--timers" in sys.argv:
        for t in ("forward-backward-time", "grads-reduce-time", "optimizer-time"):
            assert ev.get((t, k), -1) >= 0, f"no {t} at {k}"
print(f"{n} scalars over {len(rows)} iterations equal; steps {steps[0]}..{steps[-1]}")
PY

# PP 2: the writer is the last stage (rank 1), rank 0 writes metrics.jsonl
if timeout 300 mpirun -np 2 "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.pipeline_model_parallel_size=2 \
     --set logging.metrics_file="$W/pp2.jsonl" --set logging.tensorboard_dir="$W/tb_pp2" \
     --set logging.log_timers_to_tensorboard=true > "$W/pp2.log" 2>&1; then
  if out=$($PY "$CHECK" "$W/tb_pp2" "$W/pp2.jsonl" --timers 2>&1); then ok "PP 2 event file = metrics.jsonl ($out)"
  else bad "PP 2 event file"; echo "$out" | tail -5; fi
else bad "PP 2 run with tensorboard_dir"; tail -5 "$W/pp2.log"; fi

# the event file cut by the full disk: whole records, steps 1..n, every CRC good
if [ -n "$FULL_TB" ]; then
  if out=$($PY - "$FULL_TB" 2>&1 <<'PY'
import glob, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
f, = glob.glob(os.path.join(sys.argv[1], "events.out.tfevents.*"))
ea = EventAccumulator(f, size_guidance={"scalars": 0}); ea.Reload()
steps = [e.step for e in ea.Scalars("lm loss")]
assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) < 40, steps
print(f"steps 1..{len(steps)}")
PY
  ); then ok "the event file cut by the full disk reads whole ($out)"; else bad "the full disk's event file"; echo "$out" | tail -3; fi
fi

# the reader checks the CRCs: a flipped byte in the last record loses that record
if $PY - "$W/tb_pp2" "$W/corrupt" <<'PY' > "$W/corrupt.log" 2>&1
import glob, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
src = glob.glob(os.path.join(sys.argv[1], "events.out.tfevents.*"))[0]
os.makedirs(sys.argv[2], exist_ok=True)
b = bytearray(open(src, "rb").read()); b[-10] ^= 0x40
dst = os.path.join(sys.argv[2], os.path.basename(src)); open(dst, "wb").write(b)
def steps(p):
    ea = EventAccumulator(p); ea.Reload(); return [e.step for e in ea.Scalars("lm loss")]
good, bad = steps(src), steps(dst)
assert bad == good[:-1], f"corrupted file read as {bad}, intact {good}"
PY
then ok "a corrupted record fails TensorBoard's CRC check (the reader verifies them)"
else bad "CRC check on a corrupted copy"; tail -5 "$W/corrupt.log"; fi

# resume: a second event file next to the first; each file's steps = its run's metrics
if timeout 120 "$TPTRAIN" --config "$W/cfg.yaml" --set training.train_iters=3 --set checkpoint.save="$W/ck" \
     --set logging.metrics_file="$W/part1.jsonl" --set logging.tensorboard_dir="$W/tb_resume" > "$W/part1.log" 2>&1 &&
   timeout 120 "$TPTRAIN" --config "$W/cfg.yaml" --set checkpoint.load="$W/ck" \
     --set logging.metrics_file="$W/part2.jsonl" --set logging.tensorboard_dir="$W/tb_resume" > "$W/part2.log" 2>&1; then
  cat "$W/part1.jsonl" "$W/part2.jsonl" > "$W/both.jsonl"
  if out=$($PY "$CHECK" "$W/tb_resume" "$W/both.jsonl" --files 2 2>&1); then ok "resume writes a second event file ($out)"
  else bad "resume event files"; echo "$out" | tail -5; fi
else bad "resume runs"; tail -5 "$W/part1.log" "$W/part2.log"; fi

# kill -9 mid-run: the file reads up to the last flush (every logged iteration)
"$TPTRAIN" --config "$W/cfg.yaml" --set training.train_iters=100000 --set data.eval_interval=5 \
  --set logging.metrics_file="$W/killed.jsonl" --set logging.tensorboard_dir="$W/tb_killed" > "$W/killed.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -f "$W/killed.jsonl" ] && [ "$(wc -l < "$W/killed.jsonl")" -ge 7 ] && break
  sleep 0.1
done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
if out=$($PY "$CHECK" "$W/tb_killed" "$W/killed.jsonl" --prefix 2>&1) && [ "$(wc -l < "$W/killed.jsonl")" -ge 7 ]; then
  ok "a run killed with -9 leaves a readable event file ($out)"
else bad "killed run's event file"; echo "$out" | tail -5; fi

finish
