#!/usr/bin/env bash
# The include direction (scripts/check_includes.py, docs/ARCHITECTURE.md "Layers"): the repository
# passes, and trees holding an include that goes up the order, sideways between plan and interop or
# between the two backends, or to no library file, fail with the file, line and include named.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
CHECK="$TPTRAIN_SRC/scripts/check_includes.py"

if out=$($PY "$CHECK" 2>&1); then ok "the repository's includes point down"
else echo "$out"; bad "the repository's includes point down"; fi

# tree DIR FILE TEXT...: DIR gets the layer folders and FILE (repository-relative) holding TEXT
tree() {
  local dir=$1 file=$2; shift 2
  rm -rf "$dir"
  for l in apps train plan interop/hf model parallel data core/cpu core/cuda/attention; do mkdir -p "$dir/$l"; done
  mkdir -p "$(dirname "$dir/$file")"
  printf '%s\n' "$@" > "$dir/$file"
}

# a good tree: every layer includes what it may (apps everything, core/cuda/attention its backend)
G=$W/good
tree "$G" apps/main.cpp '#include "train/trainer.h"' '#include "plan/memory.h"' '#include "interop/hf/llama.h"' \
  '#include "data/dataset.h"' '#include "core/cuda/cuda_ops.h"' '#include <vector>'
printf '#include "core/ops.h"\n#include "core/cuda/kernels.h"\n' > "$G/core/cuda/attention/attention.cu"
printf '#include "model/gpt.h"\n#include "parallel/comm.h"\n' > "$G/plan/memory.cpp"
printf '#include "kernels.h"\n' > "$G/core/cpu/rope_kernels.cpp"; : > "$G/core/cpu/kernels.h"
if out=$($PY "$CHECK" --root "$G" 2>&1); then ok "a tree of allowed includes passes"
else echo "$out"; bad "a tree of allowed includes passes"; fi

# expect NAME FILE LINE INCLUDE TEXT...: a tree of FILE holding TEXT fails naming FILE:LINE and INCLUDE
expect() {
  local name=$1 file=$2 line=$3 inc=$4; shift 4
  local B=$W/bad_$name
  tree "$B" "$file" "$@"
  out=$($PY "$CHECK" --root "$B" 2>&1); rc=$?
  if [ $rc -eq 1 ] && grep -qF "$file:$line: includes \"$inc\"" <<< "$out"; then ok "$name: exit 1, $file:$line named"
  else echo "rc=$rc: $out"; bad "$name: exit 1, $file:$line named"; fi
}
expect up_model_train model/gpt.cpp 2 train/trainer.h '#include "model/gpt.h"' '#include "train/trainer.h"'
expect up_core_parallel core/ops.h 1 parallel/comm.h '#include "parallel/comm.h"'
expect up_plan_train plan/search.cpp 3 train/trainer.h '// a comment' '#include "plan/memory.h"' '  #  include "train/trainer.h"'
expect sideways_plan_interop plan/memory.cpp 1 interop/hf/llama.h '#include "interop/hf/llama.h"'
expect sideways_interop_plan interop/hf/llama_load.cpp 1 plan/memory.h '#include "plan/memory.h"'
expect sideways_data_model data/dataset.h 1 model/gpt.h '#include "model/gpt.h"'
expect sideways_cuda_cpu core/cuda/attention/attention.cu 1 core/cpu/kernels.h '#include "core/cpu/kernels.h"'
expect core_backend core/ops.h 1 core/cuda/cuda_ops.h '#include "core/cuda/cuda_ops.h"'
expect no_library_file model/gpt.cpp 1 gpt_internal.h '#include "gpt_internal.h"'

finish
