#!/usr/bin/env bash
# Reliability checks (issue 17): the unit tests once under AddressSanitizer + UndefinedBehaviorSanitizer,
# then every libFuzzer target (tests/fuzz/fuzz_*.cpp: config loader, safetensors, Megatron .idx and
# llm.c shards, a checkpoint's meta.json and latest file, the command lines of plan / data / generate /
# export / preprocess, plan and data run, the tokenizer files, an HF index.json) for FUZZ_SECONDS each (default 15),
# starting from the seeds in tests/fuzz/corpus/<target>/. A finding leaves its input in
# ${FUZZ_BUILD_DIR:-build-fuzz}/findings/ and fails the script. Needs clang and libomp (installed if missing).
#   bash scripts/fuzz.sh                 CI runs it from scripts/test.sh (CI=true)
#   FUZZ_SECONDS=300 bash scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-10}
missing=()
for p in clang libomp-dev libclang-rt-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "fuzz: building $BUILD (clang, ASan + UBSan, -O0 with line tables, no MPI, no CUDA)"
# -O0 -gline-tables-only: half the compile time of -O2 -g (the build is most of this script's time on
# 2 cores), stack traces keep their file:line; the programs run slower, which the fuzzers' fixed time
# absorbs (fewer inputs) and the unit tests' one plan-heavy case below would not
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_FLAGS_SANITIZE="-O0 -gline-tables-only" \
  -DCMAKE_C_FLAGS_SANITIZE="-O0 -gline-tables-only" -DTPTRAIN_SANITIZE=ON -DTPTRAIN_FUZZ=ON \
  -DTPTRAIN_CUDA=OFF -DTPTRAIN_MPI=OFF -DTPTRAIN_WERROR=OFF >/dev/null
targets=(fuzz_config fuzz_safetensors fuzz_corpus fuzz_checkpoint fuzz_cli fuzz_tokenizer fuzz_index)
cmake --build "$BUILD" -j"$(nproc)" --target tptrain_unit "${targets[@]}" 2>&1 | grep -E "error|warning: .*sanitize" || true
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "fuzz: unit tests under ASan + UBSan ($(nproc) shards at once)"
# less Memory.PlanBoundsCountModelChunksAndTheWorld: 2^20-pass schedule simulations, 87 s of 127 s at
# -O0 under the sanitizers, pure arithmetic on vectors the other cases cover (it runs in ctest).
# GoogleTest's shards (every core busy; the tests' files are named by their process id)
shards=$(nproc)
pids=()
for ((k = 0; k < shards; ++k)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$k "$BUILD/tests/tptrain_unit" --gtest_brief=1 \
    --gtest_filter=-Memory.PlanBoundsCountModelChunksAndTheWorld >"$BUILD/unit_sanitized.$k.log" 2>&1 &
  pids+=($!)
done
for ((k = 0; k < shards; ++k)); do
  wait "${pids[$k]}" || {
    tail -40 "$BUILD/unit_sanitized.$k.log"; echo "fuzz: unit tests under sanitizers FAILED (shard $k)"
    echo "0 passed, 1 failed"; exit 1; }
  grep -E "^\[  PASSED  \]" "$BUILD/unit_sanitized.$k.log"
done
pass=1; fail=0
mkdir -p "$BUILD/findings"
# fuzz NAME: one target for SECONDS_EACH from its seeds; its log in $BUILD/fuzz_NAME.log
fuzz() {
  local t=$1 name=${1#fuzz_}
  local work="$BUILD/corpus/$name"; mkdir -p "$work"
  "$BUILD/$t" "$work" "tests/fuzz/corpus/$name" -max_total_time="$SECONDS_EACH" -timeout=$([ "$t" = fuzz_cli ] && echo 30 || echo 10) \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$BUILD/findings/$name-" -print_final_stats=1 >"$BUILD/$t.log" 2>&1
}
# as many targets at once as there are cores (each runs for its time whatever the others do)
for ((i = 0; i < ${#targets[@]}; i += shards)); do
  batch=("${targets[@]:i:shards}")
  pids=()
  for t in "${batch[@]}"; do fuzz "$t" & pids+=($!); done
  for k in "${!batch[@]}"; do
    t=${batch[$k]}
    if wait "${pids[$k]}"; then
      echo "ok   $t: $(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$BUILD/$t.log" | grep -oE '[0-9]+$') inputs in ${SECONDS_EACH} s, no finding"
      pass=$((pass + 1))
    else
      echo "FAIL $t:"; grep -E "ERROR|SUMMARY|==[0-9]+==|Test unit written" "$BUILD/$t.log" | head -10
      fail=$((fail + 1))
    fi
  done
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
