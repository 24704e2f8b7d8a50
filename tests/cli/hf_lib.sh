# Sourced by the Hugging Face checkpoint tests (hf_llama.sh, hf_moe.sh) after lib.sh, with REF set:
#   tptrain NAME NP [--set ...]   a run of ${CFG:-$W/cfg.yaml} on NP ranks, metrics in $W/NAME.jsonl
#   compare A B WHAT [tol...]     compare_metrics.py of $W/A.jsonl and $W/B.jsonl
#   roundtrip NAME INPUT [opts]   tptrain export of $W/ck_NAME -> $W/out_NAME, every tensor's bytes and
#                                 config.json's keys (RT_KEYS: more, comma-separated) against INPUT's
#   expect2 WHAT PATTERN cmd...   cmd exits 2 printing PATTERN
#   ZERO                          --set options of one step at learning rate 0
#   greedy_check WHAT CKPT HF MAX tptrain generate --temperature 0 on CKPT: every token within 1e-4 of the
#                                 best logit of greedy.load(HF) (float64), stopping where it must
# tptrain NAME NP [--set ...]: a run of $W/cfg.yaml (or CFG=...) on NP ranks, metrics in $W/NAME.jsonl
tptrain() {
  local name=$1 np=$2
  shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun -np "$np")
  timeout 300 "${launch[@]}" "$TPTRAIN" --config "${CFG:-$W/cfg.yaml}" --set logging.metrics_file="$W/$name.jsonl" "$@" \
    > "$W/$name.log" 2>&1 || { echo "     tptrain $name exited $?:"; tail -8 "$W/$name.log" | sed 's/^/     /'; return 1; }
}
compare() {  # compare A B WHAT [tolerances...]
  local a=$1 b=$2 what=$3
  shift 3
  if $PY "$REF/compare_metrics.py" "$W/$a.jsonl" "$W/$b.jsonl" --names "$a,$b" "$@" > "$W/cmp_$a.$b.log" 2>&1; then
    ok "$what ($(grep 'largest differences' "$W/cmp_$a.$b.log" | sed 's/^ *largest differences: //; s/; tolerances.*//'))"
  else bad "$what"; sed 's/^/     /' "$W/cmp_$a.$b.log" | tail -15; fi
}

ZERO=(--set optimizer.lr=0 --set optimizer.min_lr=0 --set optimizer.lr_warmup_iters=0 --set training.train_iters=1)
roundtrip() {  # roundtrip NAME INPUT_DIR [export options...]: checkpoint $W/ck_NAME -> $W/out_NAME, compared
  local name=$1 input=$2
  shift 2
  if ! timeout 120 "$TPTRAIN" export --checkpoint "$W/ck_$name" --output "$W/out_$name" "$@" > "$W/export_$name.log" 2>&1; then
    bad "export $name"; cat "$W/export_$name.log"; return
  fi
  if out=$($PY "$REF/hf_roundtrip.py" "$input" "$W/out_$name" ${RT_KEYS:+--keys "$RT_KEYS"} 2>&1
  ); then ok "round trip $name: $out"; else bad "round trip $name"; echo "$out" | tail -5; fi
}
expect2() {  # expect2 WHAT PATTERN command...
  local what=$1 pattern=$2
  shift 2
  "$@" > "$W/bad.log" 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$pattern" "$W/bad.log"; then ok "$what: exit 2, $(grep -F -- "$pattern" "$W/bad.log" | head -1 | cut -c1-220)"
  else bad "$what (exit $rc, want 2 and '$pattern')"; tail -5 "$W/bad.log"; fi
}
greedy_check() {  # greedy_check WHAT CKPT HF_DIR MAX_NEW: tptrain generate on CKPT = greedy.load(HF_DIR)'s argmax
  local what=$1 ckpt=$2 hf=$3 max_new=$4 prompt="ab"
  timeout 120 "$TPTRAIN" generate --checkpoint "$ckpt" --prompt "$prompt" --temperature 0 --max-new-tokens "$max_new" \
    --threads 1 > "$W/gen.txt" 2> "$W/gen.err" || { bad "generate exited $?"; cat "$W/gen.err"; }
  if out=$($PY "$REF/greedy.py" --model "$hf" --float64 --prompt "$prompt" --max-new-tokens "$max_new" --check "$W/gen.txt" 2>&1
  ); then ok "$what: $out"; else bad "$what"; echo "$out" | tail -3; fi
}
