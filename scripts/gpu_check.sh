#!/usr/bin/env bash
# GPU check (issue 7): on a GPU machine, in one command and within 8 minutes,
#   1. builds tptrain with CUDA (or takes a prebuilt build directory),
#   2. runs the GPU tests (every CUDA kernel against the CPU backend, a tiny model trained on both;
#      NCCL tests too when mpirun and two GPUs are there),
#   3. benchmarks a GPT-2 124M and a 350M shape (bf16, seq 1024, the largest micro-batch that fits)
#      and prints tokens/s, TFLOP/s per GPU (Megatron's model-FLOPs formula) and MFU.
#
#   bash scripts/gpu_check.sh                         build here (needs the Debian packages of
#                                                     scripts/setup.sh, CMake and CUDA), then check
#   bash scripts/gpu_check.sh --build-dir DIR [--lib-dir DIR/lib]
#                                                     use a build made elsewhere (see --prepare)
#   bash scripts/gpu_check.sh --prepare DIR           on a build machine (no GPU needed): a portable
#                                                     single-process CUDA build in DIR and, in
#                                                     DIR/lib, the shared libraries a bare GPU machine
#                                                     lacks (yaml-cpp, spdlog, fmt, OpenBLAS, libgomp,
#                                                     libgfortran, libstdc++, cudart)
# Options: --peak-tflops X (default 989: H100/H200 dense bf16), --models "124m 350m", --iters N
# (default 8, the first 3 are warm-up), --out DIR (logs; default /tmp/tptrain_gpu_check),
# --budget SECONDS (default 480), --skip-tests.
#
# The GPU machine needs an NVIDIA driver for CUDA 13 and the CUDA 13 cuBLASLt library (the CUDA
# toolkit, or its runtime libraries): cuBLASLt is too large to carry. Its glibc must be 2.34 or newer.
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD

DEVICE=${GPU_CHECK_DEVICE:-cuda}  # cpu: a dry run of the script's logic on a machine without a GPU
BUILD="" LIBS="" PEAK=989 MODELS="124m 350m" ITERS=8 OUT=/tmp/tptrain_gpu_check BUDGET=480 PREPARE="" TESTS=1
while (($#)); do
  case $1 in
    --build-dir) BUILD=$2; shift 2 ;;
    --lib-dir) LIBS=$2; shift 2 ;;
    --peak-tflops) PEAK=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --prepare) PREPARE=$2; shift 2 ;;
    --skip-tests) TESTS=0; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
say() { echo "gpu_check [$((SECONDS - START))s] $*"; }

# ---- --prepare: a build to carry to a GPU machine ------------------------------------------------
if [ -n "$PREPARE" ]; then
  # no MPI (a bare machine has no mpirun; one process drives one GPU), AVX2 instead of -march=native
  cmake -S "$SRC" -B "$PREPARE" -DCMAKE_BUILD_TYPE=Release -DTPTRAIN_CUDA=ON -DTPTRAIN_MPI=OFF \
        -DTPTRAIN_MARCH=x86-64-v3 -DTPTRAIN_WERROR=OFF >/dev/null || exit 1
  cmake --build "$PREPARE" -j"$(nproc)" --target tptrain tptrain_gpu_tests 2>&1 | grep -E "error|warning" || true
  [ -x "$PREPARE/tptrain" ] && [ -x "$PREPARE/tests/tptrain_gpu_tests" ] || { echo "gpu_check: build failed" >&2; exit 1; }
  mkdir -p "$PREPARE/lib"
  # everything the binaries load except glibc, the driver and cuBLASLt (the GPU machine's own)
  ldd "$PREPARE/tptrain" "$PREPARE/tests/tptrain_gpu_tests" | awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublasLt)\.so' |
    while read -r lib; do cp -L "$lib" "$PREPARE/lib/"; done
  du -sh "$PREPARE/lib" "$PREPARE/tptrain" "$PREPARE/tests/tptrain_gpu_tests"
  echo "gpu_check: carry $PREPARE/tptrain, $PREPARE/tests/tptrain_gpu_tests and $PREPARE/lib, then run there:"
  echo "  bash scripts/gpu_check.sh --build-dir $PREPARE --lib-dir $PREPARE/lib"
  exit 0
fi

mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && CUDA_LIBS="${CUDA_LIBS:+$CUDA_LIBS:}$d"
done
export LD_LIBRARY_PATH="${LIBS:+$LIBS:}${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}${CUDA_LIBS:-}"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu_check: GPU /'
else
  say "nvidia-smi not found"
fi

# ---- 1. build ------------------------------------------------------------------------------------
if [ -z "$BUILD" ]; then
  BUILD=build-gpu
  say "configuring and building $BUILD (CUDA on)"
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTPTRAIN_CUDA=ON -DTPTRAIN_WERROR=ON >"$OUT/cmake.log" 2>&1 ||
    { tail -20 "$OUT/cmake.log"; exit 1; }
  timeout "$(left)" cmake --build "$BUILD" -j"$(nproc)" --target tptrain tptrain_gpu_tests >"$OUT/build.log" 2>&1 ||
    { grep -E "error" "$OUT/build.log" | head -20; say "build failed"; exit 1; }
fi
TPTRAIN=$BUILD/tptrain
GTESTS=$BUILD/tests/tptrain_gpu_tests
"$TPTRAIN" --version || { say "$TPTRAIN does not start (missing libraries? ldd: $(ldd "$TPTRAIN" | grep -c 'not found') not found)"; ldd "$TPTRAIN" | grep 'not found'; exit 1; }
status=0

# ---- 2. GPU tests ----------------------------------------------------------------------------------
if ((TESTS)); then
  say "GPU tests"
  timeout "$(($(left) > 240 ? 240 : $(left)))" "$GTESTS" --gtest_filter=-GpuNccl.* >"$OUT/gpu_tests.log" 2>&1
  rc=$?
  grep -E "^GPU 0|no GPU visible|step [0-9]+:|^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/gpu_tests.log"
  if ((rc != 0)); then status=1; say "GPU tests FAILED (rc $rc; $OUT/gpu_tests.log)"; else say "GPU tests passed"; fi
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if command -v mpirun >/dev/null && [ "${gpus:-0}" -ge 2 ] && (($(left) > 200)); then
    timeout 120 mpirun --allow-run-as-root -np 2 "$GTESTS" --gtest_filter=GpuNccl.* >"$OUT/nccl_tests.log" 2>&1 &&
      say "NCCL tests passed (2 GPUs)" || { status=1; say "NCCL tests FAILED ($OUT/nccl_tests.log)"; }
  else
    say "NCCL tests skipped (need mpirun and two GPUs)"
  fi
fi

# ---- 3. benchmarks ---------------------------------------------------------------------------------
# random tokens as an llm.c shard (GPT-2 vocabulary), enough for every run below (perl or python3)
NTOK=$((1 << 21))
if command -v perl >/dev/null; then
  perl -e 'srand(1); my $n = shift; print pack("l<3", 20240520, 1, $n), pack("x[l<253]");
           print pack("S<*", map { int(rand(50257)) } 1 .. $n);' "$NTOK" >"$OUT/tokens.bin"
else
  python3 - "$OUT/tokens.bin" "$NTOK" <<'PY' || { say "perl or python3 needed to write the benchmark tokens"; exit 1; }
import array, random, sys
n = int(sys.argv[2])
rng = random.Random(1)
with open(sys.argv[1], "wb") as f:
    array.array("i", [20240520, 1, n] + [0] * 253).tofile(f)
    array.array("H", [rng.randrange(50257) for _ in range(n)]).tofile(f)
PY
fi
[ "$(stat -c %s "$OUT/tokens.bin")" -eq $((1024 + 2 * NTOK)) ] || { say "writing $OUT/tokens.bin failed"; exit 1; }

# total GPU memory in GiB (nvidia-smi), 80 if unknown
mem_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{printf "%d", $1/1024}')
mem_gib=${mem_gib:-80}

# Largest micro-batch estimate: fp32 activation storage of tptrain (~16*S*C floats and a log-sum-exp
# per head and position per layer and sample, logits and scratch), 16-bit GEMM copies, 20 bytes/parameter
# of state.
estimate_mb() {  # L C H params
  awk -v L="$1" -v C="$2" -v H="$3" -v P="$4" -v G="$mem_gib" 'BEGIN {
    S = 1024; V = 50304
    per = 4 * (L * (S * (16 * C + 4) + H * S) + S * 11 * C + 1.5 * S * V)
    fixed = 20 * P + 2^30
    mb = int((0.85 * G * 2^30 - fixed) / per)
    print (mb < 1 ? 1 : mb) }'
}

bench() {  # name layers hidden heads params(M)
  local name=$1 L=$2 C=$3 H=$4 P=$5
  local mb
  mb=$(estimate_mb "$L" "$C" "$H" "$((P * 1000000))")
  while ((mb >= 1)); do
    if (($(left) < 60)); then say "$name: skipped (time budget)"; return; fi
    local log="$OUT/$name-mb$mb.log" metrics="$OUT/$name-mb$mb.jsonl"
    say "$name: micro-batch $mb"
    cat >"$OUT/$name-mb$mb.yaml" <<YAML
model: {num_layers: $L, hidden_size: $C, num_attention_heads: $H, seq_length: 1024, vocab_size: 50257}
training: {micro_batch_size: $mb, global_batch_size: $mb, train_iters: $ITERS, precision: bf16, device: $DEVICE}
optimizer: {lr: 6.0e-4, min_lr: 6.0e-5, lr_warmup_iters: 2}
data: {path: $OUT/tokens.bin, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1, metrics_file: $metrics}
YAML
    timeout "$(($(left) > 180 ? 180 : $(left)))" "$TPTRAIN" --config "$OUT/$name-mb$mb.yaml" >"$log" 2>&1
    local rc=$?
    if ((rc == 0)); then
      # mean over the iterations after the first 3 (cuBLASLt plans, scratch growth) of the metrics lines
      awk -v name="$name" -v mb="$mb" -v peak="$PEAK" '
        function num(key,   m) { return match($0, "\"" key "\":[-0-9.eE+]+") ? substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3) + 0 : 0 }
        { n++; ms[n] = num("elapsed_ms"); tok[n] = num("tokens_per_s"); tf[n] = num("tflops_per_device"); loss = num("lm_loss") }
        END {
          first = n > 4 ? 4 : 2; k = 0; a = b = c = 0
          for (i = first; i <= n; i++) { a += ms[i]; b += tok[i]; c += tf[i]; k++ }
          if (k == 0) { print "RESULT " name ": no timed iterations"; exit 1 }
          printf "RESULT %s: bf16, seq 1024, micro-batch %d: %.1f ms/iteration, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% of %g TFLOP/s (mean of %d iterations; loss %.3f)\n",
                 name, mb, a / k, b / k, c / k, 100 * c / k / peak, peak, k, loss
        }' "$metrics"
      return
    fi
    if grep -qiE "out of (GPU )?memory" "$log"; then
      mb=$((mb * 3 / 4)); continue
    fi
    status=1
    say "$name: tptrain failed (rc $rc), last lines of $log:"; tail -5 "$log"; return
  done
  say "$name: does not fit even with micro-batch 1"; status=1
}

for m in $MODELS; do
  case $m in
    124m) bench gpt2-124m 12 768 12 124 ;;
    350m) bench gpt2-350m 24 1024 16 355 ;;
    tiny) mem_gib=1 bench tiny 2 128 2 13 ;;  # for a dry run of this script
    *) say "unknown model '$m' (124m | 350m)"; status=1 ;;
  esac
done
say "done (status $status; logs in $OUT)"
exit $status
