#!/usr/bin/env bash
# Builds tptrain (installing missing Debian packages) and runs every test with ctest; in CI also
# scripts/fuzz.sh (sanitizers and fuzzers).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
bash scripts/setup.sh
source scripts/env.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j2 --timeout 900 "$@"
# CI (CI=true) and TPTRAIN_FUZZ=1: the unit tests under ASan + UBSan and the input parsers' fuzzers
# (scripts/fuzz.sh, a few minutes more)
if [ "${CI:-}" = true ] || [ "${TPTRAIN_FUZZ:-0}" = 1 ]; then
  cd "$ROOT" && bash scripts/fuzz.sh
fi
