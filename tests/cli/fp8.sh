#!/usr/bin/env bash
# FP8 (docs/FP8.md): the committed quantization reference tests/reference/fp8_ref.txt (which
# tests/unit/fp8_test.cpp compares core/fp8.h with, bitwise) is what tests/reference/fp8_ref.py writes;
# the training.fp8_* keys' bad combinations exit 2 naming the keys; and FP8 training, whose GEMM path
# is not built yet, is refused at start-up (exit 2) rather than run in bf16.
set -u
source "$TPTRAIN_SRC/tests/cli/lib.sh"
cd "$W" || exit 1

if "$PY" -c "import numpy" 2>/dev/null; then
  "$PY" "$TPTRAIN_SRC/tests/reference/fp8_ref.py" > ref.txt
  if cmp -s ref.txt "$TPTRAIN_SRC/tests/reference/fp8_ref.txt"; then ok "fp8_ref.txt is fp8_ref.py's output ($(wc -l < ref.txt) lines)"
  else bad "tests/reference/fp8_ref.txt differs from what fp8_ref.py writes (regenerate it)"; fi
else
  echo "skip the reference regeneration: no numpy for $PY"
fi

BASE="$TPTRAIN_SRC/tests/cli/bad_configs/base_valid.yaml"
expect_exit2 fp8_fp32 "training.fp8_format: FP8 training needs training.precision: bf16" \
  timeout 20 "$TPTRAIN" --config "$BASE" --set training.fp8_format=e4m3
expect_exit2 fp8_fp16 "got fp16" \
  timeout 20 "$TPTRAIN" --config "$BASE" --set training.fp8_format=hybrid --set training.precision=fp16
expect_exit2 fp8_recipe "training.fp8_recipe: unknown value 'current' (allowed: delayed | tensorwise | blockwise)" \
  timeout 20 "$TPTRAIN" --config "$BASE" --set training.fp8_recipe=current
expect_exit2 fp8_blockwise "training.fp8_recipe: blockwise scaling" \
  timeout 20 "$TPTRAIN" --config "$BASE" --set training.precision=bf16 --set training.fp8_format=e4m3 \
  --set training.fp8_recipe=blockwise
for dev in cpu cuda; do
  expect_exit2 "fp8_refused_$dev" "training.fp8_format: FP8 training (the linear layers' FP8 GEMMs) is not implemented" \
    timeout 20 "$TPTRAIN" --config "$BASE" --set training.precision=bf16 --set training.fp8_format=hybrid \
    --set training.device=$dev
done
finish
