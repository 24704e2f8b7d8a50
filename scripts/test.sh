#!/usr/bin/env bash
# Builds tptrain (installing missing Debian packages) and runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j2 --timeout 900 "$@"
