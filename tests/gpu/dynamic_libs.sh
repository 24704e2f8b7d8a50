#!/usr/bin/env bash
# CUDA builds (ctest gpu_dynamic_libs; needs no GPU): tptrain links neither cuDNN nor NVRTC (ldd),
# and starts and says which attention backend it found, both with cuDNN hidden (TPTRAIN_CUDNN_LIBRARY
# naming a file that does not exist: cuDNN sits in the loader's cache here, which LD_LIBRARY_PATH
# cannot hide) and, where libcudnn.so.9 is installed, with it.
set -u
T=${TPTRAIN:?TPTRAIN names the tptrain binary}
fail=0
bad() { echo "FAIL: $*"; fail=1; }

linked=$(ldd "$T" | grep -E "libcudnn|libnvrtc")
[ -z "$linked" ] || bad "tptrain links cuDNN / NVRTC: $linked"

if out=$(TPTRAIN_CUDNN_LIBRARY=/nonexistent/libcudnn.so.9 "$T" --version 2>&1); then
  echo "$out"
  if echo "$out" | grep -q "built without cuDNN"; then
    echo "this tptrain was built without cuDNN attention: nothing more to check"
    exit "$fail"
  fi
  echo "$out" | grep -q "^attention on GPUs: own flash kernels (cuDNN not found (.*nonexistent" ||
    bad "--version without cuDNN does not say so"
else
  bad "tptrain --version without cuDNN failed (rc $?): $out"
fi

if ldconfig -p 2>/dev/null | grep -q "libcudnn.so.9 " || [ -n "${LD_LIBRARY_PATH:-}" ]; then
  out=$("$T" --version 2>&1) || bad "tptrain --version failed (rc $?)"
  echo "$out"
  if echo "$out" | grep -q "cuDNN not found"; then
    ldconfig -p 2>/dev/null | grep -q "libcudnn.so.9 " && bad "libcudnn.so.9 is installed but tptrain did not load it"
  else
    echo "$out" | grep -Eq "^attention on GPUs: cuDNN SDPA \(cuDNN 9\.[0-9]+\.[0-9]+ loaded" ||
      bad "--version does not name the cuDNN it loaded"
  fi
fi
((fail == 0)) && echo "ok: no cuDNN / NVRTC linked; --version with and without cuDNN"
exit "$fail"
