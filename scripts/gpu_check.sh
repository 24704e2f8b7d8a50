#!/usr/bin/env bash
# GPU check (issue 7): on a GPU machine, in one command and within 8 minutes,
#   1. builds tptrain with CUDA (or takes a prebuilt build directory),
#   2. runs the GPU tests (every CUDA kernel against the CPU backend, a tiny model trained on both,
#      the FP8 casts' tests again under compute-sanitizer's memcheck where it is installed,
#      the trainer in TP 2 x PP 2 x DP 2 with 8 threads as ranks on one GPU, NCCL communicators of
#      one rank), and where mpirun and two GPUs are there the NCCL tests and tptrain itself on 2
#      GPUs (TP 2, PP 2, DP 2 against CPU ranks; a failing and a killed rank end the job),
#   3. benchmarks a GPT-2 124M shape at micro-batch 16 (llm.c's and the PyTorch figures' shape) and
#      at the largest micro-batch that fits by tptrain's plan (its backend workspaces included), and
#      a 350M shape at the largest (bf16, seq 1024); each run must make no device allocation after
#      its first iteration, and its "memory:" lines (allocation vs plan) are printed; it
#      prints tokens/s, TFLOP/s per GPU (Megatron's model-FLOPs formula) and MFU; after each, the
#      same shape and micro-batch in PyTorch eager (scripts/bench_torch.py: bf16 autocast, SDPA,
#      fused AdamW, fp32 master weights) and the ratio of the two; and tptrain's op profile
#      (logging.profile_ops) of the 124M micro-batch-16 run; with --models llama8b (in the default
#      list) 2 layers of the Llama-3-8B shape (hidden 4096, 32 heads, 8 KV groups, SwiGLU 14336, RoPE
#      base 500000, untied vocabulary 128256, no biases) at seq 4096, micro-batch 1, next to the same
#      layers in PyTorch (scripts/bench_torch.py --llama), and its op profile; with qwen3moe 2 MoE layers
#      of the Qwen3-30B-A3B shape (128 experts, top 8) at seq 4096, micro-batch 1, EP 1, its op profile
#      and the time the GPU waited for the host's routing; with llama8b-fp8 (last in the default list)
#      the same Llama layers in FP8 (hybrid; tensorwise, blockwise, delayed) against llama8b's run, after
#      the FP8 casts' bandwidth at the Llama layer's shapes beside a device copy's (GpuFp8.BenchmarkCasts).
#
#   bash scripts/gpu_check.sh                         build here (needs the Debian packages of
#                                                     scripts/setup.sh, CMake and CUDA), then check
#   bash scripts/gpu_check.sh --build-dir DIR [--lib-dir DIR/lib]
#                                                     use a build made elsewhere (see --prepare); DIR
#                                                     may also be the DIR.tar.xz --prepare packs
#                                                     (unpacked under --out, its lib/ taken)
#   bash scripts/gpu_check.sh --prepare DIR           on a build machine (no GPU needed): a portable
#                                                     single-process CUDA build for sm_90 (+ PTX) with
#                                                     NCCL (one-rank communicators) in DIR (with cuDNN
#                                                     attention where the cuDNN and cudnn-frontend
#                                                     headers are there) and, in DIR/lib, the shared
#                                                     libraries a bare GPU machine lacks (yaml-cpp,
#                                                     spdlog, fmt, OpenBLAS, libgomp, libgfortran,
#                                                     libstdc++, cudart); the binaries and lib/ also
#                                                     packed as DIR.tar.xz (under 60 MiB, or it fails)
# Options: --peak-tflops X (default 989: H100/H200 dense bf16), --models "124m 350m llama8b qwen3moe llama8b-fp8"
# (qwen3moe: 2 Qwen3-30B-A3B MoE layers on one GPU, with the host's routing time; llama8b-fp8: the Llama
# layers in FP8, hybrid, each recipe, each against llama8b's bf16 run), --iters N
# (default 8, the first 3 are warm-up), --out DIR (logs; default /tmp/tptrain_gpu_check),
# --budget SECONDS (default 480), --skip-tests. PYTHON=... names the python3 with PyTorch (default python3).
#
# The GPU machine needs an NVIDIA driver for CUDA 13, the CUDA 13 cuBLASLt library and, for a build
# with NCCL, NCCL 2 (the CUDA toolkit, or its runtime libraries; PyTorch's nvidia.nccl): they are
# too large to carry. cuDNN 9 and NVRTC are loaded at run time where present (else the own
# attention kernels run): the script adds the folders of PyTorch's (python3 -c 'import nvidia.cudnn')
# to LD_LIBRARY_PATH, and PyTorch's NVRTC folder after the toolkit's. Its glibc must be 2.34 or
# newer. The first lines of a run say, per library, where it was found or that it is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD

DEVICE=${GPU_CHECK_DEVICE:-cuda}  # cpu: a dry run of the script's logic on a machine without a GPU
BUILD="" LIBS="" PEAK=989 MODELS="124m 350m llama8b qwen3moe llama8b-fp8" ITERS=8 OUT=/tmp/tptrain_gpu_check BUDGET=480 PREPARE="" TESTS=1
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
    -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
START=$SECONDS
PY=${PYTHON:-python3}  # with PyTorch (the GPU machine's python3 has it) for the side-by-side baseline
left() { echo $((BUDGET - (SECONDS - START))); }
say() { echo "gpu_check [$((SECONDS - START))s] $*"; }

# ---- --prepare: a build to carry to a GPU machine ------------------------------------------------
if [ -n "$PREPARE" ]; then
  # no MPI (a bare machine has no mpirun; one process drives one GPU), AVX2 instead of -march=native;
  # cuDNN attention (TPTRAIN_CUDNN=AUTO) with the cudnn-frontend headers scripts/setup.sh fetches
  bash "$SRC/scripts/setup.sh" --cudnn-frontend
  # sm_90 SASS and its PTX (CMake's "90": real and virtual), the H100 / H200 the check targets
  cmake -S "$SRC" -B "$PREPARE" -DCMAKE_BUILD_TYPE=Release -DTPTRAIN_CUDA=ON -DTPTRAIN_MPI=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DTPTRAIN_MARCH=x86-64-v3 -DTPTRAIN_WERROR=OFF >/dev/null || exit 1
  cmake --build "$PREPARE" -j"$(nproc)" --target tptrain tptrain_gpu_tests >"$PREPARE.build.log" 2>&1
  built=$?  # not the binaries' presence: a failed rebuild leaves the last ones there
  grep -E "error|warning" "$PREPARE.build.log"
  ((built == 0)) && [ -x "$PREPARE/tptrain" ] && [ -x "$PREPARE/tests/tptrain_gpu_tests" ] ||
    { echo "gpu_check: build failed ($PREPARE.build.log)" >&2; exit 1; }
  mkdir -p "$PREPARE/lib"
  # everything the binaries load except glibc, the driver, and cuBLASLt, NCCL, NVRTC and cuDNN
  # (hundreds of MB: the GPU machine's own, NCCL and cuDNN from its PyTorch)
  ldd "$PREPARE/tptrain" "$PREPARE/tests/tptrain_gpu_tests" | awk '/=> \//{print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcublasLt|libnccl|libnvrtc[^/]*|libcudnn[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$PREPARE/lib/"; done
  "$PREPARE/tptrain" --version | grep -iE "attention|NCCL"
  # one archive of what a run needs: DIR/tptrain, DIR/tests/tptrain_gpu_tests, DIR/lib
  XZ_OPT=-T0 tar -C "$PREPARE" -cJf "$PREPARE.tar.xz" tptrain tests/tptrain_gpu_tests lib || exit 1
  du -sh "$PREPARE/lib" "$PREPARE/tptrain" "$PREPARE/tests/tptrain_gpu_tests"
  folder=$(du -cb "$PREPARE/lib" "$PREPARE/tptrain" "$PREPARE/tests/tptrain_gpu_tests" | tail -1 | cut -f1)
  packed=$(stat -c %s "$PREPARE.tar.xz")
  echo "gpu_check: prepared $((folder >> 20)) MiB ($((folder)) bytes); packed $PREPARE.tar.xz: $((packed >> 20)) MiB ($packed bytes)"
  ((packed < 60 << 20)) || { echo "gpu_check: $PREPARE.tar.xz is over 60 MiB" >&2; exit 1; }
  echo "gpu_check: carry $PREPARE.tar.xz (or $PREPARE/tptrain, tests/tptrain_gpu_tests and lib/), then run there:"
  echo "  bash scripts/gpu_check.sh --build-dir $PREPARE.tar.xz"
  exit 0
fi

# --build-dir DIR.tar.xz: what --prepare packed, unpacked under --out
if [[ "$BUILD" == *.tar.xz ]]; then
  mkdir -p "$OUT/prepared" && tar -C "$OUT/prepared" -xJf "$BUILD" || { say "cannot unpack $BUILD"; exit 1; }
  BUILD=$OUT/prepared
  [ -n "$LIBS" ] || LIBS=$BUILD/lib
fi

mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && CUDA_LIBS="${CUDA_LIBS:+$CUDA_LIBS:}$d"
done
# cuDNN (for cuDNN attention) from PyTorch's wheels, whose NVRTC also serves where the toolkit has none
TORCH_LIBS=$("$PY" -c '
import importlib, os
dirs = []
for name in ("nvidia.cudnn", "nvidia.cu13", "nvidia.cuda_nvrtc", "nvidia.nccl"):
    try:
        m = importlib.import_module(name)
    except Exception:
        continue
    dirs += [os.path.join(p, "lib") for p in m.__path__ if os.path.isdir(os.path.join(p, "lib"))]
print(":".join(dirs))' 2>/dev/null)
LDP="${LIBS:+$LIBS:}${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}${CUDA_LIBS:+$CUDA_LIBS:}${TORCH_LIBS:-}"
export LD_LIBRARY_PATH="${LDP%:}"
# one line per library a run needs: where the loader finds it, or MISSING (the binary's own needs
# from ldd where it is built; cuDNN and NVRTC, loaded at run time, and the driver by name)
LIB_DIRS=$({ tr ':' '\n' <<<"$LD_LIBRARY_PATH"; ldconfig -p 2>/dev/null | awk -F'=> ' '/=>/{sub("/[^/]*$", "", $2); print $2}'; } |
           awk 'NF && !seen[$0]++')
find_lib() { local d; for d in $LIB_DIRS; do [ -e "$d/$1" ] && { echo "$d/$1"; return; }; done; }
required=(libcuda.so.1 libcublasLt.so.13 libcudnn.so.9 libnvrtc.so.13)
if [ -n "$BUILD" ] && [ -x "$BUILD/tptrain" ]; then
  required+=($(ldd "$BUILD/tptrain" | awk '$2 == "=>" {print $1}' | grep -vE '^(libc|libm|libdl|libpthread|librt|linux-vdso)\.'))
fi
for lib in $(printf '%s\n' "${required[@]}" | awk '!seen[$0]++'); do
  where=$(find_lib "$lib")
  case $lib in libcudnn*|libnvrtc*) what=" (optional: cuDNN attention)" ;; *) what="" ;; esac
  if [ -n "$where" ]; then echo "gpu_check: library $lib: $where"; else echo "gpu_check: library $lib: MISSING$what"; fi
done
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu_check: GPU /'
else
  say "nvidia-smi not found"
fi

# ---- 1. build ------------------------------------------------------------------------------------
if [ -z "$BUILD" ]; then
  BUILD=build-gpu
  say "configuring and building $BUILD (CUDA on)"
  # cuDNN attention: the cudnn-frontend headers (carried in .deps/, or fetched if PyPI answers),
  # cuDNN's headers and library from PyTorch's wheel unless the toolkit has them
  PIP_RETRIES=0 PIP_TIMEOUT=10 bash "$SRC/scripts/setup.sh" --cudnn-frontend
  [ -n "${CUDNN_HOME:-}" ] || CUDNN_HOME=$("$PY" -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null) || true
  CUDNN_HOME=$CUDNN_HOME cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTPTRAIN_CUDA=ON \
    -DTPTRAIN_WERROR=ON >"$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
  grep "cuDNN attention" "$OUT/cmake.log"
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
  grep -E "^GPU 0|no GPU visible|cannot start|step [0-9]+:|^cuBLASLt epilogues|^cuda \(device|WARNING: cuDNN|^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/gpu_tests.log"
  if ((rc == 77)); then say "GPU tests skipped (no GPU visible to them)"  # tests/gpu/main.cpp's skip status
  elif ((rc != 0)); then status=1; say "GPU tests FAILED (rc $rc; $OUT/gpu_tests.log)"; else say "GPU tests passed"; fi
  # the FP8 casts' kernels (rewritten 2026-12-06, unrun then) under compute-sanitizer's memcheck: an
  # access out of bounds fails here even where the codes happen to compare equal
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if ((rc == 0)) && [ -n "$SAN" ] && (($(left) > 300)); then
    timeout 90 "$SAN" --tool memcheck --leak-check no --error-exitcode 3 "$GTESTS" \
      --gtest_filter='GpuFp8.CastTransposeBitwiseAsCpu:GpuFp8.QuantizeBlocksBitwiseAsCpu' >"$OUT/memcheck.log" 2>&1 &&
      say "memcheck of the FP8 casts: clean" || { status=1; say "memcheck of the FP8 casts FAILED ($OUT/memcheck.log)"; tail -20 "$OUT/memcheck.log"; }
  elif ((rc == 0)); then
    say "memcheck of the FP8 casts skipped (no compute-sanitizer on the PATH or in /usr/local/cuda/bin, or under 300 s of the budget left)"
  fi
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

# ---- 2b. tptrain on two or more GPUs (mpirun) -------------------------------------------------------
# TP 2, PP 2, DP 2, DP 2 with the distributed optimizer (NCCL reduce-scatter and all-gather on the
# communication stream, overlapped) and TP 2 with sequence parallelism on 2 GPUs in bf16 against
# the same layout on CPU ranks (losses within 2e-2
# relative, the mixed-precision tolerance), then a rank failing mid-step (TPTRAIN_FAULT) and a rank
# killed (SIGKILL) mid-run: the job must end, with the rank's message, well within the 1-minute
# watchdog (parallel.distributed_timeout_minutes 1).
multi_gpu_cli() {
  cat >"$OUT/multi.yaml" <<YAML
model: {num_layers: 2, hidden_size: 128, num_attention_heads: 4, seq_length: 128, vocab_size: 50257}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 8, precision: bf16, seed: 3}
parallel: {overlap_grad_reduce: true, distributed_timeout_minutes: 1}
data: {path: $OUT/tokens.bin, split: [100, 0, 0], eval_iters: 0}
YAML
  local case set name kv
  for case in "tensor2 parallel.tensor_model_parallel_size=2" "pipeline2 parallel.pipeline_model_parallel_size=2" \
              "data2" "data2_distopt parallel.distributed_optimizer=true parallel.overlap_param_gather=true" \
              "tensor2_sp parallel.tensor_model_parallel_size=2 parallel.sequence_parallel=true"; do
    set -- $case; name=$1; shift; set=()
    for kv in "$@"; do set+=(--set "$kv"); done
    for dev in cuda cpu; do
      timeout 120 mpirun --allow-run-as-root -np 2 "$TPTRAIN" --config "$OUT/multi.yaml" "${set[@]}" \
        --set training.device=$dev --set training.cpu_threads=4 --set logging.metrics_file="$OUT/${name}_$dev.jsonl" \
        >"$OUT/${name}_$dev.log" 2>&1 || { status=1; say "$name on $dev FAILED ($OUT/${name}_$dev.log)"; continue 2; }
    done
    if "$PY" "$SRC/tests/tools/compare_runs.py" "$OUT/${name}_cpu.jsonl" "$OUT/${name}_cuda.jsonl" --rel 2e-2 --keys lm_loss \
        >"$OUT/${name}_compare.log" 2>&1; then say "$name on 2 GPUs matches 2 CPU ranks: $(tail -1 "$OUT/${name}_compare.log")"
    else status=1; say "$name on 2 GPUs differs from CPU ranks: $(tail -2 "$OUT/${name}_compare.log")"; fi
  done
  # FP8 parameters over NCCL (docs/FP8.md "FP8 parameters"): DP 2 with the distributed optimizer and the
  # overlapped parameter gathers, hybrid FP8 (delayed), with and without them: the losses bit for bit
  # (clip_grad 0) -- the casts of each rank's blocks, the amaxes' reduction and the codes' all-gather
  for pg in false true; do
    timeout 120 mpirun --allow-run-as-root -np 2 "$TPTRAIN" --config "$OUT/multi.yaml" --set training.device=cuda \
      --set parallel.distributed_optimizer=true --set parallel.overlap_param_gather=true --set optimizer.clip_grad=0 \
      --set training.fp8_format=hybrid --set training.fp8_param_gather=$pg \
      --set logging.metrics_file="$OUT/fp8p_dp2_$pg.jsonl" >"$OUT/fp8p_dp2_$pg.log" 2>&1 ||
      { status=1; say "FP8 parameters on 2 GPUs (fp8_param_gather $pg) FAILED ($OUT/fp8p_dp2_$pg.log)"; }
  done
  if "$PY" "$SRC/tests/tools/compare_runs.py" "$OUT/fp8p_dp2_false.jsonl" "$OUT/fp8p_dp2_true.jsonl" --rel 0 --keys lm_loss \
      >"$OUT/fp8p_dp2_compare.log" 2>&1; then say "FP8 parameters on 2 GPUs (DP 2): the losses without them bit for bit"
  else status=1; say "FP8 parameters on 2 GPUs differ: $(tail -2 "$OUT/fp8p_dp2_compare.log")"; fi
  local t0=$SECONDS rc
  TPTRAIN_FAULT=1:3 timeout 150 mpirun --allow-run-as-root -np 2 "$TPTRAIN" --config "$OUT/multi.yaml" \
    --set parallel.tensor_model_parallel_size=2 --set training.train_iters=50 --set training.device=cuda >"$OUT/fault.log" 2>&1
  rc=$?
  if ((rc != 0 && rc != 124)) && grep -q "rank 1: injected fault" "$OUT/fault.log"; then
    say "a failing rank ends the 2-GPU job in $((SECONDS - t0)) s (exit $rc)"
  else status=1; say "failing rank: exit $rc after $((SECONDS - t0)) s, no message ($OUT/fault.log)"; fi
  t0=$SECONDS
  timeout 150 mpirun --allow-run-as-root -np 2 "$TPTRAIN" --config "$OUT/multi.yaml" --set training.train_iters=100000 \
    --set training.device=cuda --set logging.metrics_file="$OUT/kill.jsonl" >"$OUT/kill.log" 2>&1 &
  local job=$!
  while [ ! -s "$OUT/kill.jsonl" ] && kill -0 $job 2>/dev/null && ((SECONDS - t0 < 60)); do sleep 0.5; done
  pkill -9 -f -n "tptrain --config $OUT/multi.yaml" || true  # the newest rank
  wait $job; rc=$?
  if ((rc != 0 && rc != 124)); then say "a killed rank ends the 2-GPU job in $((SECONDS - t0)) s (exit $rc)"
  else status=1; say "killed rank: the job did not end by itself (exit $rc after $((SECONDS - t0)) s; $OUT/kill.log)"; fi
}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if ((TESTS)) && command -v mpirun >/dev/null && [ "${gpus:-0}" -ge 2 ] && (($(left) > 300)); then
  say "tptrain on 2 GPUs (mpirun)"
  multi_gpu_cli
elif ((TESTS)); then
  say "tptrain on 2 GPUs skipped (need mpirun and two GPUs)"
fi

# ---- 2c. FP8 parameters on one GPU (training.fp8_param_gather, docs/FP8.md "FP8 parameters") ----------
# a small Llama shape in FP8 (hybrid; each recipe) with and without FP8 parameters: the master
# weights' 16-bit rounding (Ops::master_copy), their cast into the parameters' codes (blockwise: the parts'
# block amaxes and given-block casts) and the GEMMs reading
# those must give the losses of the kept weight copies bit for bit (clip_grad 0: the gradient norm is
# summed in another order, the FP8 parameters' span being last)
fp8_params_gpu() {
  cat >"$OUT/fp8p.yaml" <<YAML
model: {num_layers: 2, hidden_size: 256, num_attention_heads: 4, ffn_hidden_size: 512, seq_length: 128, vocab_size: 50257,
        normalization: RMSNorm, swiglu: true, position_embedding_type: rope, untie_embeddings_and_output_weights: true,
        add_bias_linear: false}
training: {micro_batch_size: 4, global_batch_size: 8, train_iters: 8, precision: bf16, seed: 3, device: cuda,
           fp8_format: hybrid}
optimizer: {clip_grad: 0}
parallel: {distributed_optimizer: true}
data: {path: $OUT/tokens.bin, split: [100, 0, 0], eval_iters: 0}
YAML
  local r pg
  for r in tensorwise delayed blockwise; do
    for pg in false true; do
      timeout 90 "$TPTRAIN" --config "$OUT/fp8p.yaml" --set training.fp8_recipe=$r --set training.fp8_param_gather=$pg \
        --set logging.metrics_file="$OUT/fp8p_${r}_$pg.jsonl" >"$OUT/fp8p_${r}_$pg.log" 2>&1 ||
        { status=1; say "FP8 parameters: the $r run (fp8_param_gather $pg) FAILED ($OUT/fp8p_${r}_$pg.log)"; continue 2; }
    done
    if "$PY" "$SRC/tests/tools/compare_runs.py" "$OUT/fp8p_${r}_false.jsonl" "$OUT/fp8p_${r}_true.jsonl" --rel 0 \
        --keys lm_loss >"$OUT/fp8p_${r}_compare.log" 2>&1; then say "FP8 parameters ($r) on the GPU: the losses without them bit for bit"
    else status=1; say "FP8 parameters ($r) on the GPU differ: $(tail -2 "$OUT/fp8p_${r}_compare.log")"; fi
    grep -h "^memory: allocated" "$OUT/fp8p_${r}_false.log" "$OUT/fp8p_${r}_true.log" | cut -c1-120
  done
}
if ((TESTS)) && (($(left) > 120)); then fp8_params_gpu; fi

# total GPU memory in GiB (nvidia-smi), 80 if unknown
mem_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{printf "%.2f", $1/1024}')
mem_gib=${mem_gib:-80}

# Largest micro-batch by tptrain's own plan (plan/memory.h: every tensor tptrain allocates and the
# GPU backend's own buffers -- cuBLASLt's and cuDNN's attention workspaces, the reductions' scratch
# -- which the start-up "memory: allocated ... (plan: ...)" line checks), in 92% of the device: the
# rest for the CUDA context, NCCL and the allocator. Doubling, then bisection; 1 if nothing fits.
largest_mb() {  # yaml
  local yaml=$1 lo=0 hi=1 mid usable
  usable=$(awk -v g="$mem_gib" 'BEGIN { printf "%.2f", 0.92 * g }')
  fits() {
    "$TPTRAIN" plan --config "$yaml" --set training.micro_batch_size="$1" --set training.global_batch_size="$1" \
      --device-memory-gib "$usable" 2>/dev/null | grep -q '^fits: yes'
  }
  while ((hi <= 4096)) && fits "$hi"; do lo=$hi; hi=$((hi * 2)); done
  while ((hi - lo > 1)); do
    mid=$(((lo + hi) / 2))
    if fits "$mid"; then lo=$mid; else hi=$mid; fi
  done
  echo $((lo < 1 ? 1 : lo))
}

# PyTorch eager on the same shape and micro-batch (scripts/bench_torch.py), then tptrain's
# tokens/s over PyTorch's; and, with --profile, a short tptrain run with logging.profile_ops whose
# op table is printed.
side_by_side() {  # name layers hidden heads mb tptrain_tokens_per_s
  local name=$1 L=$2 C=$3 H=$4 mb=$5 tpt=$6
  if (($(left) < 60)); then say "$name: PyTorch baseline skipped (time budget)"; return; fi
  local dev=$DEVICE; [ "$dev" = cuda ] || dev=cpu
  timeout "$(($(left) > 150 ? 150 : $(left)))" "$PY" "$SRC/scripts/bench_torch.py" --layers "$L" --hidden "$C" \
    --heads "$H" --seq "$SEQ" --micro-batch "$mb" --iters "$ITERS" --warmup 3 --device "$dev" ${TORCH_EXTRA:-} \
    >"$OUT/$name-mb$mb-torch.json" 2>"$OUT/$name-mb$mb-torch.err"
  local torch_tps
  torch_tps=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_s"])' "$OUT/$name-mb$mb-torch.json" 2>/dev/null)
  if [ -z "$torch_tps" ]; then
    say "$name: PyTorch baseline failed: $(tail -1 "$OUT/$name-mb$mb-torch.err" "$OUT/$name-mb$mb-torch.json" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  awk -v n="$name" -v mb="$mb" -v a="$tpt" -v b="$torch_tps" -v sys="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["system"])' "$OUT/$name-mb$mb-torch.json")" \
    'BEGIN { printf "SIDE BY SIDE %s, micro-batch %d: tptrain %.0f tokens/s, PyTorch %.0f tokens/s (%s): ratio %.2f\n", n, mb, a, b, sys, a / b }'
}

# ms per iteration of the transformer layers' ops in an op profile's table
layer_ms() {
  sed -n '/op profile of rank 0/,/all ops/p' "$1" | awk '
    /^  op |all ops|op profile/ { next }
    /adamw|gradient norm|lm_head|cross-entropy|embedding|zero|copy|to host|to device/ { next }
    { for (i = 1; i <= NF; ++i) if ($i ~ /^[0-9.]+$/ && $(i + 1) ~ /^[0-9.]+$/) { s += $(i + 1); break } }
    END { printf "%.3f", s }'
}

profile() {  # name yaml
  local name=$1 yaml=$2
  if (($(left) < 60)); then say "$name: op profile skipped (time budget)"; return; fi
  timeout "$(($(left) > 120 ? 120 : $(left)))" "$TPTRAIN" --config "$yaml" --set logging.profile_ops=true \
    --set training.train_iters=5 --set logging.metrics_file=null >"$OUT/$name-profile.log" 2>&1 ||
    { say "$name: profiled run failed ($OUT/$name-profile.log)"; return; }
  sed -n '/op profile of rank 0/,/all ops/p' "$OUT/$name-profile.log"
}

# bench's shape beyond GPT-2 (the Llama case sets them): sequence, vocabulary, extra model keys (a YAML
# flow-map fragment), bench_torch.py's extra arguments
# TRAINING_EXTRA: extra training keys (FP8); LABEL: the run's precision in its RESULT line; NO_TORCH=1: no
# PyTorch run beside it (the FP8 runs compare with tptrain's bf16 run of the same shape instead)
# GPU_CHECK_NO_TORCH=1: no PyTorch baselines at all (a short run)
SEQ=1024 VOCAB=50257 MODEL_EXTRA="" TORCH_EXTRA="" TRAINING_EXTRA="" LABEL=bf16 NO_TORCH="${GPU_CHECK_NO_TORCH:-}" BF16_OF=""
write_yaml() {  # name micro-batch layers hidden heads -> $OUT/<name>-mb<micro-batch>.yaml
  cat >"$OUT/$1-mb$2.yaml" <<YAML
model: {num_layers: $3, hidden_size: $4, num_attention_heads: $5, seq_length: $SEQ, vocab_size: $VOCAB$MODEL_EXTRA}
training: {micro_batch_size: $2, global_batch_size: $2, train_iters: $ITERS, precision: bf16, device: $DEVICE$TRAINING_EXTRA}
optimizer: {lr: 6.0e-4, min_lr: 6.0e-5, lr_warmup_iters: 2}
data: {path: $OUT/tokens.bin, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1, metrics_file: $OUT/$1-mb$2.jsonl}
YAML
}
bench() {  # name layers hidden heads params(M) [micro-batch; default: the largest the plan fits] [--profile]
  local name=$1 L=$2 C=$3 H=$4  # $5: parameters (millions), for the reader
  local mb=${6:-} searched=""
  if [ -z "$mb" ]; then
    write_yaml "$name" 1 "$L" "$C" "$H"
    mb=$(largest_mb "$OUT/$name-mb1.yaml") searched=" (the plan's largest in $mem_gib GiB)"
  fi
  while ((mb >= 1)); do
    if (($(left) < 60)); then say "$name: skipped (time budget)"; return; fi
    local log="$OUT/$name-mb$mb.log" metrics="$OUT/$name-mb$mb.jsonl"
    say "$name: micro-batch $mb$searched"
    write_yaml "$name" "$mb" "$L" "$C" "$H"
    timeout "$(($(left) > 180 ? 180 : $(left)))" "$TPTRAIN" --config "$OUT/$name-mb$mb.yaml" >"$log" 2>&1
    local rc=$?
    if ((rc == 0)); then
      # the plan against the allocation, and no device allocation inside iterations after the first
      grep -E "^memory: " "$log"
      grep -q "^memory: no device allocation or free in iterations" "$log" ||
        { status=1; say "$name: the device allocator was called after iteration 1 ($log)"; }
      # mean over the iterations after the first 3 (cuBLASLt plans, scratch growth) of the metrics lines
      awk -v name="$name" -v mb="$mb" -v peak="$PEAK" -v seq="$SEQ" -v label="$LABEL" '
        function num(key,   m) { return match($0, "\"" key "\":[-0-9.eE+]+") ? substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3) + 0 : 0 }
        { n++; ms[n] = num("elapsed_ms"); tok[n] = num("tokens_per_s"); tf[n] = num("tflops_per_device"); loss = num("lm_loss") }
        END {
          first = n > 4 ? 4 : 2; k = 0; a = b = c = 0
          for (i = first; i <= n; i++) { a += ms[i]; b += tok[i]; c += tf[i]; k++ }
          if (k == 0) { print "RESULT " name ": no timed iterations"; exit 1 }
          printf "RESULT %s: %s, seq %d, micro-batch %d: %.1f ms/iteration, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% of %g TFLOP/s (mean of %d iterations; loss %.3f)\n",
                 name, label, seq, mb, a / k, b / k, c / k, 100 * c / k / peak, peak, k, loss
        }' "$metrics" | tee "$OUT/$name-mb$mb.result"
      grep -m2 -E "WARNING: cuDNN attention|WARNING: rank [0-9]+: cuDNN" "$log"  # shapes cuDNN refused, workspaces beyond the plan
      grep -m1 -o "moe: routing on the host took .*" "$log"  # MoE: what the GPU waited for
      local tps
      tps=$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' "$OUT/$name-mb$mb.result")
      [ -n "$tps" ] && [ -z "$NO_TORCH" ] && side_by_side "$name" "$L" "$C" "$H" "$mb" "$tps"
      if [ -n "$tps" ] && [ -n "$NO_TORCH" ] && [ -f "$OUT/$BF16_OF-mb$mb.result" ]; then  # FP8 against our bf16
        local base
        base=$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' "$OUT/$BF16_OF-mb$mb.result")
        [ -n "$base" ] && awk -v n="$name" -v a="$tps" -v b="$base" \
          'BEGIN { printf "RESULT %s: %.2fx tptrain bf16 of the same shape (%d vs %d tokens/s; goal >= 1.3x)\n", n, a / b, a, b }'
      fi
      [ "${7:-}" = --profile ] && profile "$name-mb$mb" "$OUT/$name-mb$mb.yaml"
      if [ "${7:-}" = --profile ] && [ -n "$NO_TORCH" ] && [ -f "$OUT/$BF16_OF-mb$mb-profile.log" ]; then
        # the transformer layers alone (what FP8 changes), from both op profiles: the ops outside them
        # (optimizer, gradient norm, output layer, loss, embeddings, zeroing, copies) left out
        local a b
        a=$(layer_ms "$OUT/$name-mb$mb-profile.log") b=$(layer_ms "$OUT/$BF16_OF-mb$mb-profile.log")
        awk -v n="$name" -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "RESULT %s: the layers %.2fx tptrain bf16 (%.1f vs %.1f ms per iteration of their ops)\n", n, b / a, a, b }'
      fi
      return
    fi
    if grep -qiE "out of (GPU )?memory" "$log"; then
      [ -n "$searched" ] && say "$name: the plan's micro-batch $mb did not fit: $(grep -m1 -iE 'out of (GPU )?memory' "$log")"
      status=1; mb=$((mb * 3 / 4)); searched=""; continue
    fi
    status=1
    say "$name: tptrain failed (rc $rc), last lines of $log:"; tail -5 "$log"; return
  done
  say "$name: does not fit even with micro-batch 1"; status=1
}

# Qwen3-MoE's layer (configs/qwen3-30b-a3b.yaml) but its experts' count, width and top-k
QWEN3MOE=", ffn_hidden_size: 6144, group_query_attention: true, num_query_groups: 4, kv_channels: 128, normalization: RMSNorm, layernorm_epsilon: 1.0e-6, swiglu: true, position_embedding_type: rope, rotary_base: 1000000, untie_embeddings_and_output_weights: true, add_bias_linear: false, qk_layernorm: true, moe_aux_loss_coeff: 1.0e-3"
for m in $MODELS; do
  case $m in
    124m) bench gpt2-124m 12 768 12 124 16 --profile  # the shape of llm.c's and PyTorch's figures
          bench gpt2-124m 12 768 12 124 ;;
    350m) bench gpt2-350m 24 1024 16 355 ;;
    llama8b)  # 2 Llama-3-8B layers + its embeddings (1.49B parameters); tokens < 50257 fit its vocabulary
      SEQ=4096 VOCAB=128256 TORCH_EXTRA="--llama --groups 8 --ffn 14336 --vocab 128256" \
      MODEL_EXTRA=", ffn_hidden_size: 14336, normalization: RMSNorm, swiglu: true, position_embedding_type: rope, rotary_base: 500000, group_query_attention: true, num_query_groups: 8, untie_embeddings_and_output_weights: true, add_bias_linear: false" \
        bench llama3-8b-2layers 2 4096 32 1490 1 --profile ;;
    llama8b-fp8)  # the same 2 layers in FP8 (hybrid), each recipe, against the bf16 run of llama8b
      if [ "$DEVICE" = cuda ] && [ -x "$GTESTS" ]; then  # first the casts' bandwidth beside a device copy's
        TPTRAIN_FP8_BENCH=1 timeout 120 "$GTESTS" --gtest_filter=GpuFp8.BenchmarkCasts >"$OUT/fp8_cast_bench.log" 2>&1 ||
          say "the FP8 cast benchmark failed ($OUT/fp8_cast_bench.log)"
        grep "fp8 cast bench" "$OUT/fp8_cast_bench.log"
      fi
      for r in tensorwise blockwise delayed; do
        SEQ=4096 VOCAB=128256 NO_TORCH=1 LABEL="fp8 hybrid $r" BF16_OF=llama3-8b-2layers \
        TRAINING_EXTRA=", fp8_format: hybrid, fp8_recipe: $r" \
        MODEL_EXTRA=", ffn_hidden_size: 14336, normalization: RMSNorm, swiglu: true, position_embedding_type: rope, rotary_base: 500000, group_query_attention: true, num_query_groups: 8, untie_embeddings_and_output_weights: true, add_bias_linear: false" \
          bench "llama3-8b-2layers-fp8-$r" 2 4096 32 1490 1 $([ $r = tensorwise ] && echo --profile)
      done ;;
    qwen3moe)  # 2 layers of Qwen3-30B-A3B's shape (configs/qwen3-30b-a3b.yaml: 128 SwiGLU experts of width
      # 768, top 8, aux loss) on one GPU (EP 1) + its embeddings (1.87B parameters; the plan: 35 GiB); no PyTorch beside it.
      # Its log's "moe: routing on the host" line is the time the GPU waited for the host's routing.
      SEQ=4096 VOCAB=151936 NO_TORCH=1 MODEL_EXTRA="$QWEN3MOE, num_moe_experts: 128, moe_ffn_hidden_size: 768, moe_router_topk: 8" \
        bench qwen3-30b-a3b-2layers 2 2048 32 1870 1 --profile ;;
    tiny) mem_gib=1 bench tiny 2 128 2 13 "" --profile ;;  # for a dry run of this script
    tinyllama) SEQ=64 TORCH_EXTRA="--llama --groups 2 --ffn 256 --vocab 50304" \
      MODEL_EXTRA=", ffn_hidden_size: 256, normalization: RMSNorm, swiglu: true, position_embedding_type: rope, group_query_attention: true, num_query_groups: 2, untie_embeddings_and_output_weights: true, add_bias_linear: false" \
        mem_gib=1 bench tinyllama 2 128 4 13 2 --profile ;;  # a dry run of the Llama case
    tinyllama-fp8)  # a dry run of llama8b-fp8
      for r in tensorwise blockwise; do
        SEQ=64 NO_TORCH=1 LABEL="fp8 hybrid $r" BF16_OF=tinyllama TRAINING_EXTRA=", fp8_format: hybrid, fp8_recipe: $r" \
        MODEL_EXTRA=", ffn_hidden_size: 256, normalization: RMSNorm, swiglu: true, position_embedding_type: rope, group_query_attention: true, num_query_groups: 2, untie_embeddings_and_output_weights: true, add_bias_linear: false" \
          mem_gib=1 bench "tinyllama-fp8-$r" 2 128 4 13 2 $([ $r = tensorwise ] && echo --profile)
      done ;;
    tinymoe) SEQ=64 NO_TORCH=1 MODEL_EXTRA="$QWEN3MOE, num_moe_experts: 8, moe_ffn_hidden_size: 64, moe_router_topk: 2" \
      mem_gib=1 bench tinymoe 2 128 4 13 2 --profile ;;  # a dry run of qwen3moe
    *) say "unknown model '$m' (124m | 350m | llama8b | llama8b-fp8 | qwen3moe)"; status=1 ;;
  esac
done
say "done (status $status; logs in $OUT)"
exit $status
