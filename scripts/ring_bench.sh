#!/usr/bin/env bash
# Context parallelism's ring blocks on one GPU against the whole sequence's cuDNN attention (issue 44):
# the benchmark GpuRingAttention.BenchmarkRingBlocksAgainstWholeSequence of the GPU tests
# (tests/gpu/ring_attention_test.cpp): bf16, 32 heads, 8 KV heads, D 128, S 16k and 32k, CP 2 and 4
# simulated on one GPU (every rank's every block, the same total work); it prints one line per case
# with both times and their ratio (the bar: within 1.3x). Needs cuDNN (libcudnn.so.9).
#
#   bash scripts/ring_bench.sh DIR     DIR: a CUDA build directory, or what
#                                      `scripts/gpu_check.sh --prepare DIR` made (DIR/lib is added to
#                                      LD_LIBRARY_PATH where it is there)
set -euo pipefail
DIR=${1:?usage: ring_bench.sh BUILD_DIR}
BIN=$DIR/tests/tptrain_gpu_tests
[ -x "$BIN" ] || { echo "ring_bench: no $BIN (build the tptrain_gpu_tests target)" >&2; exit 2; }
[ -d "$DIR/lib" ] && export LD_LIBRARY_PATH="$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN from PyTorch's wheel where the loader has none of its own (as gpu_check.sh does)
CUDNN=$(${PYTHON:-python3} -c 'import nvidia.cudnn as c; print(list(c.__path__)[0] + "/lib")' 2>/dev/null || true)
[ -n "$CUDNN" ] && [ -d "$CUDNN" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$CUDNN"
TPTRAIN_RING_BENCH=1 exec "$BIN" --gtest_filter='GpuRingAttention.BenchmarkRingBlocksAgainstWholeSequence'
