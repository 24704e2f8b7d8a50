#!/usr/bin/env bash
# The README's commands as a newcomer pastes them: every line of the code blocks of its "Quick start",
# "Training" and "Plan" sections runs, one after the other, in one fresh `bash --norc` shell with an
# empty environment and the PATH the set-up leaves (scripts/setup.sh links tptrain into a bin folder
# on it; here a bin folder of the test's, first), in a directory laid out as the repository's root
# (configs/ and scripts/ linked, data_cache/ made here); each must exit 0. What the test changes:
#   - training runs (a `tptrain` or `mpirun ... tptrain` line with --config, not plan) get
#     `--set training.train_iters=2` appended (a later --set wins), to keep the test short;
#   - cfg.yaml, the README's stand-in for the reader's config, is a tiny GPT written here (world 1, 2,
#     8 or 64: global batch 64 of micro-batch 1) whose metrics go to run/metrics.jsonl, which the Plan
#     block's --calibrate line reads;
#   - data_cache/fortunes_text_document, the demo's dataset (made by scripts/demo.sh), is made here
#     from the README and docs/ with `tptrain preprocess` (byte-level, as the demo's);
#   - skipped, with the reason printed: `bash scripts/demo.sh` and `bash scripts/test.sh` (the two
#     set-up commands themselves: the demo trains for minutes, test.sh runs this test).
# A line the test does not know how to run on this machine fails it: edit the README or the rules here.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
README=$TPTRAIN_SRC/README.md

# --- the commands: lines of the ``` blocks under the three headings (comment-only lines and blank ones out)
mapfile -t cmds < <(awk '/^## / { sec = $0; next }
  /^```/ { inblock = !inblock; next }
  inblock && (sec ~ /^## Quick start/ || sec == "## Training" || sec == "## Plan") && $0 !~ /^ *(#|$)/ { print }' "$README")
if ((${#cmds[@]} >= 12)); then ok "README: ${#cmds[@]} commands in Quick start, Training and Plan"
else bad "README: only ${#cmds[@]} commands found"; fi

# --- a root-like directory, a bin folder with tptrain, the data, cfg.yaml -------------------------------
R=$W/root; mkdir -p "$R/data_cache" "$W/bin" "$W/home" "$W/logs"
ln -s "$TPTRAIN_SRC/configs" "$R/configs"; ln -s "$TPTRAIN_SRC/scripts" "$R/scripts"
ln -s "$TPTRAIN" "$W/bin/tptrain"
"$TPTRAIN" preprocess --input "$README" "$TPTRAIN_SRC"/docs/*.md --output-prefix "$R/data_cache/fortunes_text_document" \
  --append-eod > "$W/logs/preprocess.log" 2>&1 || { bad "preprocess"; cat "$W/logs/preprocess.log"; }
cat > "$R/cfg.yaml" <<'EOF'
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 32, vocab_size: 257}
training: {micro_batch_size: 1, global_batch_size: 64, train_iters: 2, device: cpu, cpu_threads: 1}
optimizer: {lr: 1.0e-3}
data: {path: data_cache/fortunes_text_document, split: [98, 2, 0], eval_interval: 1000, eval_iters: 1}
logging: {log_interval: 1, metrics_file: run/metrics.jsonl}
EOF
mkdir -p "$R/run"

# --- the shell script a paste amounts to: each line, its exit status recorded -----------------------------
S=$W/paste.sh; : > "$S"; i=0
for c in "${cmds[@]}"; do
  i=$((i + 1))
  case "$c" in
    "bash scripts/demo.sh"*|"bash scripts/test.sh"*)
      echo "echo 'skip $i: ${c//\'/} (a set-up command: minutes of training / the whole suite, this test included)'" >> "$S"
      continue;;
  esac
  run=${c%%  #*}                          # the trailing comment off (two spaces and #)
  run=${run%"${run##*[![:space:]]}"}
  if [[ "$run" =~ (^|[[:space:]])tptrain[[:space:]]+--config ]]; then run="$run --set training.train_iters=2"; fi
  printf '{ %s ; } > %q 2>&1; echo "$? %d"\n' "$run" "$W/logs/$i.log" "$i" >> "$S"
  printf '%s\n' "$run" > "$W/logs/$i.cmd"
done
start=$SECONDS
timeout 300 env -i HOME="$W/home" PATH="$W/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  bash --norc --noprofile -c "cd '$R' && source '$S'" > "$W/results" 2>&1
echo "pasted in $((SECONDS - start)) s"
while read -r rc n rest; do
  if [ "$rc" = skip ]; then echo "skip $n $rest"; continue; fi
  if [ "$rc" = 0 ]; then ok "README line $n: $(cat "$W/logs/$n.cmd")"
  else bad "README line $n exits $rc: $(cat "$W/logs/$n.cmd")"; tail -5 "$W/logs/$n.log"; fi
done < <(sed -E 's/^skip ([0-9]+): /skip \1 /' "$W/results")
ran=$(grep -c '^[0-9]' "$W/results")
want=$(grep -c '; echo "\$? ' "$S")
if [ "$ran" = "$want" ]; then ok "all $want runnable lines ran"; else bad "$ran of $want lines ran"; cat "$W/results"; fi
finish
