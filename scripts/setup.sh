#!/usr/bin/env bash
# Installs what tptrain needs from Debian's packages (idempotent; silent when all is present),
# then configures and builds into ${BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake pkg-config git libyaml-cpp-dev libspdlog-dev nlohmann-json3-dev
          libopenblas-dev libopenmpi-dev openmpi-bin libgtest-dev
          python3 python3-numpy python3-yaml python3-torch python3-matplotlib fortunes-min fortunes)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DTPTRAIN_WERROR="${TPTRAIN_WERROR:-ON}" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" 2>&1 | grep -vE '^\[ *[0-9]+%\]|^gmake|^Consolidate' || true
test -x "$BUILD_DIR/tptrain" || { echo "setup: build failed" >&2; exit 1; }
