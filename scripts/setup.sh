#!/usr/bin/env bash
# Installs what tptrain needs from Debian's packages (idempotent; silent when all is present) and,
# where nvcc is, the cudnn-frontend headers (below), then configures and builds into ${BUILD_DIR:-build}
# and links tptrain into a bin folder on the PATH (the end of this file).
#   bash scripts/setup.sh                    all of that
#   bash scripts/setup.sh --cudnn-frontend   only the cudnn-frontend headers (scripts/gpu_check.sh --prepare)
set -euo pipefail
cd "$(dirname "$0")/.."

# cuda: cuDNN attention (core/cuda/attention/cudnn_attention.cpp) needs the header-only cudnn-frontend: the C++
# headers of PyPI's nvidia-cudnn-frontend wheel, unpacked once into .deps/cudnn_frontend/include
# (git-ignored), where CMake looks for them (TPTRAIN_CUDNN). The wheel is fetched for one fixed
# Python and platform whatever pip runs it (only its headers are used). Without them the build
# goes on without cuDNN attention.
CUDNN_FE_DIR=$PWD/.deps/cudnn_frontend
CUDNN_FE_VERSION=${CUDNN_FRONTEND_VERSION:-1.32.0}
have_nvcc() { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }
have_cudnn_frontend() { [ -f "$CUDNN_FE_DIR/include/cudnn_frontend.h" ]; }
pip_python() {  # a python3 whose pip works (pyenv's, Debian's), or nothing
  local c
  for c in python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -m pip --version >/dev/null 2>&1; then echo "$c"; return; fi
  done
}
install_cudnn_frontend() {
  have_cudnn_frontend && return 0
  local py tmp rc=0
  py=$(pip_python)
  if [ -z "$py" ]; then
    echo "setup: cuDNN attention off: no python3 with pip to fetch the cudnn-frontend headers (apt-get install python3-pip)"
    return 0
  fi
  tmp=$(mktemp -d)
  PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --disable-pip-version-check --no-input --no-deps \
    --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
    --target "$tmp/wheel" "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" >"$tmp/log" 2>&1 || rc=$?
  if ((rc == 0)) && [ -f "$tmp/wheel/include/cudnn_frontend.h" ]; then
    mkdir -p "$CUDNN_FE_DIR"
    rm -rf "$CUDNN_FE_DIR/include"
    mv "$tmp/wheel/include" "$CUDNN_FE_DIR/include"
    echo "setup: cudnn-frontend $CUDNN_FE_VERSION headers in $CUDNN_FE_DIR/include (for cuDNN attention)"
  else
    echo "setup: cuDNN attention off: could not fetch the cudnn-frontend $CUDNN_FE_VERSION headers from PyPI" \
         "($(grep -v '^ *$' "$tmp/log" | tail -1 | cut -c1-160))"
  fi
  rm -rf "$tmp"
}
if [ "${1:-}" = --cudnn-frontend ]; then
  install_cudnn_frontend
  exit 0
fi

PACKAGES=(build-essential cmake pkg-config git libyaml-cpp-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
          libopenblas-dev libopenmpi-dev openmpi-bin libgtest-dev libpcre2-dev
          libutf8proc-dev
          python3 python3-numpy python3-yaml python3-torch python3-matplotlib fortunes-min fortunes)
# cuda: pip fetches the cudnn-frontend headers (Debian's python3 has no pip of its own)
if have_nvcc && ! have_cudnn_frontend && [ -z "$(pip_python)" ]; then PACKAGES+=(python3-pip); fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]} (python3-torch is large: minutes on a first set-up)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: installed in $SECONDS s"
fi

CMAKE_EXTRA=()
if have_nvcc; then
  install_cudnn_frontend
  have_cudnn_frontend && CMAKE_EXTRA+=(-DCUDNN_FRONTEND_INCLUDE="$CUDNN_FE_DIR/include")
fi

# BUILD_TARGETS: what to build (default all: tptrain and the tests; the demo builds only tptrain).
# Progress: a line each time CMake's percentage moves by 10 or more, and at least every 30 s while
# it compiles (with the elapsed time and the file at hand), then the time it took.
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TARGETS=${BUILD_TARGETS:-all}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DTPTRAIN_WERROR="${TPTRAIN_WERROR:-ON}" "${CMAKE_EXTRA[@]}" >/dev/null
t0=$SECONDS
# first builds measured on a 2-core machine: tptrain alone 3.4 min (2026-12-01, no CUDA files); all
# targets with the CUDA files 8.6 min (2026-12-02, while other builds shared the machine)
if [ -x "$BUILD_DIR/tptrain" ]; then echo "setup: building $BUILD_TARGETS in $BUILD_DIR/ (what changed only)"
else echo "setup: building $BUILD_TARGETS in $BUILD_DIR/ with $(nproc) jobs (a first build on 2 cores took $([ "$BUILD_TARGETS" = tptrain ] && echo 4.5 || echo 7 to 15) minutes)"; fi
set +e
cmake --build "$BUILD_DIR" -j"$(nproc)" --target $BUILD_TARGETS 2>&1 | {
  shown=0 last=$SECONDS
  while IFS= read -r line; do
    if [[ $line =~ ^\[\ *([0-9]+)%\]\ (.*)$ ]]; then
      p=${BASH_REMATCH[1]} what=${BASH_REMATCH[2]}
      if ((p >= shown + 10 || SECONDS - last >= 30)); then
        ((p >= shown + 10)) && shown=$((p - p % 10))
        echo "setup: build ${p}% after $((SECONDS - t0)) s (${what##* })"
        last=$SECONDS
      fi
      continue
    fi
    [[ $line =~ ^(gmake|Consolidate) ]] || echo "$line"
  done
}
status=${PIPESTATUS[0]}
set -e
[ "$status" = 0 ] && [ -x "$BUILD_DIR/tptrain" ] || { echo "setup: build failed (cmake --build exit $status)" >&2; exit 1; }
echo "setup: built in $((SECONDS - t0)) s"

# `tptrain` by name in every new shell: a symlink to the build in a bin folder on the PATH
# (TPTRAIN_BIN_DIR, else /usr/local/bin as root, ~/.local/bin otherwise; said so when that is not on the PATH).
binary=$(cd "$BUILD_DIR" && pwd)/tptrain
bin_dir=${TPTRAIN_BIN_DIR:-$([ "$(id -u)" -eq 0 ] && echo /usr/local/bin || echo "$HOME/.local/bin")}
if mkdir -p "$bin_dir" 2>/dev/null && ln -sfn "$binary" "$bin_dir/tptrain" 2>/dev/null; then
  echo "setup: $bin_dir/tptrain -> $binary"
  case ":$PATH:" in
    *":$bin_dir:"*) ;;
    *) echo "setup: $bin_dir is not on your PATH: add it (e.g. echo 'export PATH=\"$bin_dir:\$PATH\"' >> ~/.bashrc) to run tptrain by name";;
  esac
else
  echo "setup: could not link $bin_dir/tptrain (TPTRAIN_BIN_DIR=... to choose another folder); the binary is $binary"
fi
