#!/usr/bin/env bash
# Benchmark of checkpoint.async_save on CPU ranks (not a test; docs/FAILURES.md "Background checkpoint
# saves" has the numbers measured with it): the same run with sync and async saves, a model whose
# checkpoint is ~1.4 GB (113M parameters x 12 B: fp32 weights, exp_avg, exp_avg_sq), then dd of the
# same size to the same disk.
#   scripts/bench_async_save.sh [TPTRAIN [DIR]]     (default build/tptrain, a fresh directory in /tmp)
# Prints: a normal iteration's time, the sync save's time, the async save's stall (the copy) and the
# ratio of the two, the iterations during the background write, the write's time and GB/s, and dd's GB/s.
set -euo pipefail
TPTRAIN=$(realpath "${1:-build/tptrain}")
DIR=${2:-$(mktemp -d /tmp/bench_async_save.XXXX)}
HIDDEN=${HIDDEN:-1536} LAYERS=${LAYERS:-4}
SRC=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$DIR"
PY=${PYTHON:-/usr/bin/python3}
"$PY" "$SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 20000 --docs 20 --seed 3 --megatron "$DIR/data" > /dev/null
cat > "$DIR/cfg.yaml" <<YAML
model: {num_layers: $LAYERS, hidden_size: $HIDDEN, num_attention_heads: 12, seq_length: 32, vocab_size: 97}
training: {micro_batch_size: 1, global_batch_size: 1, train_iters: 8, cpu_threads: 1, seed: 1}
optimizer: {lr: 1.0e-4}
data: {path: $DIR/data, split: [100, 0, 0], eval_iters: 0}
checkpoint: {save_interval: 4}
logging: {log_interval: 1}
YAML
for mode in false true; do
  rm -rf "$DIR/ck_$mode"
  "$TPTRAIN" --config "$DIR/cfg.yaml" --set checkpoint.save="$DIR/ck_$mode" --set checkpoint.async_save=$mode \
    --set logging.metrics_file="$DIR/m_$mode.jsonl" > "$DIR/log_$mode.txt" 2>&1
done
bytes=$(du -sb "$DIR/ck_true/iter_0000004" | cut -f1)
dd_out=$(dd if=/dev/zero of="$DIR/dd.bin" bs=4M count=$((bytes / 4194304 + 1)) conv=fsync 2>&1 | tail -1)
rm -f "$DIR/dd.bin"
"$PY" - "$DIR" "$bytes" "$dd_out" <<'PY'
import json, re, sys
d, nbytes, dd = sys.argv[1], int(sys.argv[2]), sys.argv[3]
load = lambda p: {j["iteration"]: j for j in map(json.loads, filter(str.strip, open(p)))}
sync, asyn = load(f"{d}/m_false.jsonl"), load(f"{d}/m_true.jsonl")
log = open(f"{d}/log_true.txt").read()
normal = sorted([sync[2]["elapsed_ms"], sync[3]["elapsed_ms"], asyn[2]["elapsed_ms"], asyn[3]["elapsed_ms"]])[1] / 1e3
sync_s = [sync[4]["save_checkpoint_time"], sync[8]["save_checkpoint_time"]]
saves = re.findall(r"saved checkpoint at iteration (\d+) .*stall ([0-9.]+) s, background write ([0-9.]+) s, "
                   r"([0-9.]+) GB/s; completed at iteration (\d+)", log)
m = re.search(r"copied, ([0-9.]+) s, ([0-9.,]+ [GM]B/s)", dd)
print(f"checkpoint {nbytes / 1e9:.2f} GB; a normal iteration {normal:.3f} s")
for (it, stall, write, gbps, done), sync_t in zip(saves, sync_s):
    during = [asyn[i]["elapsed_ms"] / 1e3 for i in range(int(it) + 1, int(done) + 1)]
    print(f"save of {it}: sync {sync_t:.3f} s; async stall (copy) {float(stall):.3f} s, stall / sync = "
          f"{float(stall) / sync_t:.3f}; background write {write} s = {gbps} GB/s, committed at iteration {done}; "
          f"iterations meanwhile {', '.join(f'{t:.3f}' for t in during)} s")
print(f"dd (4 MiB blocks, conv=fsync) {m.group(1) if m else '?'} s = {m.group(2) if m else dd}")
PY
echo "(runs in $DIR)"
