#!/usr/bin/env bash
# The step-time model against published Megatron / NeMo runs (tests/plan/published.yaml): each row's
# estimate within +-20 % of the published throughput, and --search on the row's model, GPUs and batch
# lists the published layout, ranks the layouts fastest first and its first one as `tptrain plan`
# estimates it; every MoE row's published layout plans to fit the GPU it ran on, and for the skipped
# MoE rows the search on that GPU lists each published layout (tests/plan/published_check.py).
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
if $PYTHON "$TPTRAIN_SRC/tests/plan/published_check.py" "$TPTRAIN" "$TPTRAIN_SRC/tests/plan/published.yaml" "$W"; then
  ok "published runs: every row within 20 %, the search finds each published layout"
else bad "published runs"; fi
finish
