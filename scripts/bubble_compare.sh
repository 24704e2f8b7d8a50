#!/usr/bin/env bash
# The pipeline schedules side by side on CPU ranks (issue 16): 1F1B, interleaved 1F1B (2 model
# chunks per rank) and zb-h1 on the same model, grid and micro-batches, alternating rounds; for each
# run the median iteration time and scripts/bubble.py's measured bubble (the median over iterations
# of the stages' idle share) next to the schedule's formula.
#
#   bash scripts/bubble_compare.sh [--np 8] [--pp 8] [--rounds 3] [--iters 25] [--out DIR]
#
# Needs at least --np free cores: with more ranks than cores the ranks time-share the cores and the
# idle share measures that, not the schedule (8 ranks on 2 cores: all three near 0.44).
set -uo pipefail
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$SRC/scripts/env.sh"
NP=8; PP=8; ROUNDS=3; ITERS=25; OUT=/tmp/tptrain_bubble
while [ $# -gt 0 ]; do
  case $1 in
    --np) NP=$2; shift 2 ;;
    --pp) PP=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "bubble_compare: unknown argument $1 (see the header of $0)"; exit 2 ;;
  esac
done
PY=${PYTHON:-/usr/bin/python3}
mkdir -p "$OUT"
cores=$(nproc)
[ "$cores" -ge "$NP" ] || echo "bubble_compare: WARNING: $NP ranks on $cores cores: the ranks time-share the cores"
"$PY" "$SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 200000 --docs 50 --seed 3 --megatron "$OUT/data" >/dev/null 2>&1
# 2 layers per rank (1 per chunk interleaved), M = 2 PP micro-batches per DP rank: 1F1B's bubble
# (PP - 1)/(3 PP - 1) is large, interleaving halves it, zb-h1 fills it with weight gradients
cat > "$OUT/cfg.yaml" <<YAML
model: {num_layers: $((2 * PP)), hidden_size: 256, num_attention_heads: 4, seq_length: 32, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
parallel: {pipeline_model_parallel_size: $PP}
training: {micro_batch_size: 4, global_batch_size: $((8 * NP)), train_iters: $ITERS, cpu_threads: 1, seed: 7}
optimizer: {lr: 3.0e-3}
data: {path: $OUT/data, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
for round in $(seq "$ROUNDS"); do
  for s in 1f1b interleaved zb-h1; do
    extra=()
    [ $s = interleaved ] && extra=(--set parallel.virtual_pipeline_model_parallel_size=2)
    [ $s = zb-h1 ] && extra=(--set parallel.pipeline_schedule=zb-h1)
    name=${s}_$round
    if ! timeout 600 mpirun -np "$NP" "${TPTRAIN:-$SRC/build/tptrain}" --config "$OUT/cfg.yaml" \
        --set logging.trace_file="$OUT/$name.json" "${extra[@]}" > "$OUT/$name.log" 2>&1; then
      echo "bubble_compare: $name failed"; tail -5 "$OUT/$name.log"; exit 1
    fi
    ms=$(grep -o 'per iteration (ms): [0-9.]*' "$OUT/$name.log" | tail -n +6 | awk '{print $4}' | sort -n |
         awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')
    echo "round $round, $s: median $ms ms per iteration"
    "$PY" "$SRC/scripts/bubble.py" "$OUT/$name.json" --skip-first 5 | grep -E "median|formula" | sed 's/^/  /'
  done
done
