#!/usr/bin/env bash
# Inconsistent grids (and pipeline chunkings) fail fast on every rank with exit 2 and the reason, before any collective.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
$PYTHON "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 5000 --docs 5 --megatron "$W/data" >/dev/null 2>&1
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 48, num_attention_heads: 6, seq_length: 16, vocab_size: 97}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 2, cpu_threads: 1}
data: {path: $W/data, split: [100, 0, 0]}
YAML
check() {  # name np expect-substring args...
  local name=$1 np=$2 want=$3; shift 3
  local start=$SECONDS
  timeout 60 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" "$@" > "$W/$name.out" 2> "$W/$name.err"
  local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$want" "$W/$name.err"; then
    echo "ok   $name: exit 2 in $((SECONDS - start))s: $(grep -m1 error "$W/$name.err")"; pass=$((pass+1))
  else
    echo "FAIL $name: exit $rc (want 2 and '$want')"; cat "$W/$name.err" | head -5; fail=$((fail+1))
  fi
}
check world_not_divisible 3 "tensor_model_parallel_size" --set parallel.tensor_model_parallel_size=2
check heads_not_divisible 4 "num_attention_heads" --set parallel.tensor_model_parallel_size=4
check layers_not_divisible 3 "num_layers" --set parallel.pipeline_model_parallel_size=3
check dp_inconsistent 4 "data_parallel_size" --set parallel.tensor_model_parallel_size=2 --set parallel.data_parallel_size=3
check batch_not_divisible 4 "global_batch_size" --set training.global_batch_size=6
check ffn_not_divisible 2 "ffn_hidden_size" --set parallel.tensor_model_parallel_size=2 --set model.ffn_hidden_size=99
# the interleaved schedule's model chunks (parallel.virtual_pipeline_model_parallel_size)
V=parallel.virtual_pipeline_model_parallel_size
check chunks_layers_not_divisible 2 "num_layers.*$V" --set parallel.pipeline_model_parallel_size=2 --set $V=3
check chunks_without_pp 1 "$V.*pipeline_model_parallel_size > 1" --set $V=2
check chunks_with_zb 2 "$V.*pipeline_schedule: 1f1b" --set parallel.pipeline_model_parallel_size=2 --set $V=2 \
  --set parallel.pipeline_schedule=zb-h1
check chunks_microbatches 2 "multiple of parallel.pipeline_model_parallel_size" --set parallel.pipeline_model_parallel_size=2 \
  --set $V=2 --set training.global_batch_size=6
check zb_full_recompute 2 "zb-h1.*training.recompute: full" --set parallel.pipeline_model_parallel_size=2 \
  --set parallel.pipeline_schedule=zb-h1 --set training.recompute=full
check chunks_zero 2 "$V: must be >= 1" --set parallel.pipeline_model_parallel_size=2 --set $V=0
finish
