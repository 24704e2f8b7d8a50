#!/usr/bin/env bash
# The demo: builds tptrain, turns the fortune cookies of Debian's fortunes packages into a
# Megatron dataset with `tptrain preprocess`, and trains a small GPT (configs/demo.yaml) on two
# CPU ranks. Extra arguments go to tptrain (e.g. --set training.train_iters=50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
mkdir -p data_cache
if [ ! -f data_cache/fortunes_text_document.idx ]; then
  inputs=()
  for f in /usr/share/games/fortunes/*; do
    case "$f" in *.dat|*.u8|*-o) continue;; esac
    [ -f "$f" ] && inputs+=("$f")
  done
  "$TPTRAIN" preprocess --input "${inputs[@]}" --output-prefix data_cache/fortunes_text_document --append-eod
fi
NP=${NP:-2}
exec mpirun -np "$NP" "$TPTRAIN" --config configs/demo.yaml "$@"
