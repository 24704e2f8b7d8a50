#!/usr/bin/env bash
# The demo, end to end on CPU ranks (about 4 minutes on 2 cores once built, under 10 from a fresh clone):
#   1. builds tptrain alone (scripts/setup.sh: Debian packages, cmake; progress every 10%);
#   2. turns the fortune cookies of Debian's fortunes packages into a Megatron dataset
#      (tptrain preprocess, byte-level tokens) in data_cache/;
#   3. trains configs/demo.yaml in a 3D layout, TP 2 x PP 2 x DP 2 on 8 ranks (mpirun -np 8),
#      saving a checkpoint, the metrics and a trace of the pipeline schedule;
#   4. prints two samples from the checkpoint (tptrain generate);
#   5. draws the loss curves and the schedule timeline (scripts/plot_metrics, scripts/plot_schedule).
# Everything it writes goes to data_cache/demo/ (DEMO_DIR=... to change). Extra arguments go to the
# training run, e.g. `bash scripts/demo.sh --set training.train_iters=100`; NP=4 with
# `--set parallel.tensor_model_parallel_size=1` runs PP 2 x DP 2 instead. DEMO_SKIP_SETUP=1 skips
# step 1 and uses the binary named by TPTRAIN (default build/tptrain).
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
[ "${DEMO_SKIP_SETUP:-0}" = 1 ] || BUILD_TARGETS=tptrain bash scripts/setup.sh  # the demo needs only tptrain
source scripts/env.sh
PY=/usr/bin/python3
DEMO_DIR=${DEMO_DIR:-data_cache/demo}
NP=${NP:-8}
PROMPT=${PROMPT:-"Love is"}
mkdir -p data_cache "$DEMO_DIR"

if [ ! -f data_cache/fortunes_text_document.idx ]; then
  inputs=()
  for f in /usr/share/games/fortunes/*; do
    case "$f" in *.dat|*.u8|*-o) continue;; esac
    [ -f "$f" ] && inputs+=("$f")
  done
  "$TPTRAIN" preprocess --input "${inputs[@]}" --output-prefix data_cache/fortunes_text_document --append-eod \
    > "$DEMO_DIR/preprocess.log"
  tail -1 "$DEMO_DIR/preprocess.log"
fi

# A fresh run each time: the previous demo's checkpoints would otherwise stay next to the new ones.
rm -rf "$DEMO_DIR/checkpoints" "$DEMO_DIR/tensorboard"
t_train=$(date +%s)
mpirun -np "$NP" "$TPTRAIN" --config configs/demo.yaml \
  --set checkpoint.save="$DEMO_DIR/checkpoints" --set checkpoint.save_interval=100000 \
  --set logging.metrics_file="$DEMO_DIR/metrics.jsonl" --set logging.trace_file="$DEMO_DIR/trace.json" \
  --set logging.tensorboard_dir="$DEMO_DIR/tensorboard" "$@"
t_trained=$(date +%s)
ckpt=$(cat "$DEMO_DIR/checkpoints/latest_checkpointed_iteration.txt")
grid=$($PY -c 'import json, sys; g = json.load(open(sys.argv[1]))["grid"]
print("TP %d x PP %d x DP %d" % (g["tensor_model_parallel_size"], g["pipeline_model_parallel_size"], g["data_parallel_size"]))' \
  "$DEMO_DIR/checkpoints/iter_$(printf %07d "$ckpt")/meta.json")

echo
echo "=== samples from the checkpoint: tptrain generate --temperature 0.7 --top-k 40, a new fortune (empty"
echo "=== prompt) and a continuation of \"$PROMPT\""
for prompt in "" "$PROMPT"; do
  "$TPTRAIN" generate --checkpoint "$DEMO_DIR/checkpoints" --prompt "$prompt" --max-new-tokens 200 \
    --temperature 0.7 --top-k 40 --seed 7 2>> "$DEMO_DIR/generate.log"
  echo "---"
done
echo

$PY scripts/plot_metrics "$DEMO_DIR/metrics.jsonl" -o "$DEMO_DIR/loss.png" \
  --title "tptrain demo: configs/demo.yaml, $grid on $NP CPU ranks" > "$DEMO_DIR/plots.log"
$PY scripts/plot_schedule "$DEMO_DIR/trace.json" -o "$DEMO_DIR/schedule.png" >> "$DEMO_DIR/plots.log"
t_end=$(date +%s)

cat <<EOF
demo done in $((t_end - t_start)) s (training $((t_trained - t_train)) s). Outputs in $DEMO_DIR/:
  checkpoints/     the checkpoint (iteration $ckpt, saved on $grid); it loads on any layout:
                     $TPTRAIN generate --checkpoint $DEMO_DIR/checkpoints --prompt "Q: Why"
                     $TPTRAIN export --checkpoint $DEMO_DIR/checkpoints --output $DEMO_DIR/hf
  loss.png         train / validation loss, learning rate, grad norm, throughput (from metrics.jsonl)
  schedule.png     the pipeline schedule of the last iteration, one row per rank (from trace.json)
  metrics.jsonl    one JSON object per logged iteration;  trace.json: open in https://ui.perfetto.dev
EOF
