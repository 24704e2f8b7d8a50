#!/usr/bin/env bash
# The seed article's grid on one small machine: mpirun -np 192 with TP 4 x PP 6 x DP 8 and a tiny
# 12-layer GPT, a few iterations on CPU ranks (1 thread each, heavily oversubscribed), compared
# step by step with the same training on one rank; then the same grid with the distributed
# optimizer and sequence parallelism (overlapped), compared the same way. Prints the runs' losses,
# the wall time and the peak memory. Outside CI (it takes minutes): bash scripts/grid192.sh [iterations]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "${BUILD_DIR:-build}/tptrain" ] || bash scripts/setup.sh
source scripts/env.sh
ITERS=${1:-3}
W=${W:-$(mktemp -d)}
mkdir -p "$W"
/usr/bin/python3 tests/reference/make_tokens.py --vocab 257 --tokens 100000 --docs 40 --megatron "$W/data" >/dev/null 2>&1
cat > "$W/grid192.yaml" <<YAML
model: {num_layers: 12, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: 257,
        make_vocab_size_divisible_by: 16}
parallel: {tensor_model_parallel_size: 4, pipeline_model_parallel_size: 6, pipeline_schedule: 1f1b}
training: {micro_batch_size: 1, global_batch_size: 96, train_iters: $ITERS, cpu_threads: 1}
optimizer: {lr: 1.0e-3, lr_warmup_iters: 1}
data: {path: $W/data, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
run192() {  # name title [--set ...]
  local name=$1 title=$2; shift 2
  echo "== 192 ranks: TP 4 x PP 6 x DP 8 (2 micro-batches per DP rank)$title =="
  local start end
  start=$(date +%s.%N)
  mpirun -np 192 --mca btl self,vader --bind-to none "$TPTRAIN" --config "$W/grid192.yaml" \
    --set logging.metrics_file="$W/$name.jsonl" "$@" 2>&1 | grep -E "^iteration|peak memory|process grid|distributed optimizer|error"
  end=$(date +%s.%N)
  echo "wall time (mpirun start to end): $(echo "$end - $start" | bc) s"
}
run192 grid192 ""
run192 grid192_distopt_sp ", distributed optimizer + sequence parallelism, overlapped" \
  --set parallel.distributed_optimizer=true --set parallel.sequence_parallel=true \
  --set parallel.overlap_grad_reduce=true --set parallel.ddp_bucket_size=1 --set parallel.overlap_param_gather=true
echo "== 1 rank, same model and data =="
"$TPTRAIN" --config "$W/grid192.yaml" --set parallel.tensor_model_parallel_size=1 \
  --set parallel.pipeline_model_parallel_size=1 --set training.micro_batch_size=8 \
  --set logging.metrics_file="$W/single.jsonl" 2>&1 | grep -E "^iteration|peak memory"
echo "== per-step comparison (192 ranks vs 1 rank) =="
/usr/bin/python3 tests/tools/compare_runs.py "$W/single.jsonl" "$W/grid192.jsonl" --rel 1e-5 --min-iters 1
echo "== per-step comparison (192 ranks with the distributed optimizer and sequence parallelism vs 1 rank) =="
/usr/bin/python3 tests/tools/compare_runs.py "$W/single.jsonl" "$W/grid192_distopt_sp.jsonl" --rel 1e-5 --min-iters 1
