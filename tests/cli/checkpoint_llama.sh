#!/usr/bin/env bash
# Checkpoints of the LLaMA shape (docs/ARCHITECTURE.md "Checkpoint format"; the model of
# tests/cli/layouts_llama.sh: RMSNorm, SwiGLU, RoPE base 500000, GQA with G = 2 KV groups of 8 heads,
# kv_channels 8, untied output layer, no biases) on byte-level text (vocab 257, what generate's
# tokenizer reads):
#  (a) resume is exact on the same layout (TP2 x PP2, fp32): 10 iterations straight vs 5, stop, and
#      a resume to 10 give bitwise-equal lm loss and grad norm at iterations 6..10, and bitwise-equal
#      final parameters and Adam moments;
#  (b) the TP2 x PP2 checkpoint (QKV sharded by groups, [gate; up] along F, lm_head vocab-parallel)
#      resumes at TP1 x PP1 and at TP2 x PP1 (each group whole on one rank) within 1e-5 of the
#      uninterrupted run, final parameters too;
#  (c) tptrain generate prints the prompt and a continuation from TP2 x PP2 checkpoints (this model
#      trained for 200 iterations, and (a)'s, whose resumed twin gives the same text); each greedy
#      token is the best of the PyTorch reference model (tests/reference/model_ref.py, no KV cache)
#      on the checkpoint's tensors (assembled by tests/tools/checkpoint_tensors.py), up to a 1e-4 tie;
#  (d) the G = 2 checkpoint at TP 4 (G % TP != 0) exits 2 naming model.num_query_groups and
#      parallel.tensor_model_parallel_size; at TP 4 with G = 4 the saved QKV's shape does not fit: exit 2;
#  (e) with Qwen3's q/k norms (model.qk_layernorm) a TP2 x PP2 checkpoint of iteration 5 resumes at
#      TP1 x PP1 within 1e-5 of the uninterrupted TP2 x PP2 run, and generate's greedy tokens from that
#      run's checkpoint (the KV cache holding normalised keys) are the reference model's best as in (c).
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
CMP="$TPTRAIN_SRC/tests/tools/compare_runs.py"
CKT="$TPTRAIN_SRC/tests/tools/checkpoint_tensors.py"

# A small text, documents separated by blank lines, preprocessed with the byte-level tokenizer.
cat > "$W/text.txt" <<'TEXT'
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.

A cat sat on the mat. The cat saw a rat. The rat ran to the barn.

Twinkle, twinkle, little star, how I wonder what you are. Up above the world so high, like a diamond in the sky.

Row, row, row your boat, gently down the stream. Merrily, merrily, merrily, merrily, life is but a dream.

The rain in Spain stays mainly in the plain.

Early to bed and early to rise makes a man healthy, wealthy and wise.

The quick brown fox likes the sun. The lazy dog likes the mat.

Jack and Jill went up the hill to fetch a pail of water. Jack fell down and broke his crown, and Jill came tumbling after.

Humpty Dumpty sat on a wall. Humpty Dumpty had a great fall. All the king's horses and all the king's men couldn't put Humpty together again.

Mary had a little lamb, its fleece was white as snow. And everywhere that Mary went, the lamb was sure to go.

The cat and the fox ran over the hill to the barn in the rain.

Hickory dickory dock, the mouse ran up the clock. The clock struck one, the mouse ran down.

Old King Cole was a merry old soul, and a merry old soul was he. He called for his pipe, and he called for his bowl.

Baa, baa, black sheep, have you any wool? Yes sir, yes sir, three bags full.
TEXT
"$TPTRAIN" preprocess --input "$W/text.txt" --output-prefix "$W/text" --append-eod > "$W/pre.log" 2>&1 ||
  { echo "FAIL: preprocess"; cat "$W/pre.log"; echo "0 passed, 1 failed"; exit 1; }

# lr_decay_iters is fixed so that the 5-iteration first half has the schedule of the 10-iteration run.
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 8, group_query_attention: true, num_query_groups: 2,
        kv_channels: 8, ffn_hidden_size: 96, swiglu: true, normalization: RMSNorm,
        position_embedding_type: rope, rotary_base: 500000, untie_embeddings_and_output_weights: true,
        add_bias_linear: false, seq_length: 16, max_position_embeddings: 64, vocab_size: 257,
        make_vocab_size_divisible_by: 8}
parallel: {tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 10, cpu_threads: 1, seed: 7}
optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, lr_warmup_iters: 2, lr_decay_iters: 10, weight_decay: 0.1, clip_grad: 0.5}
data: {path: $W/text, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML

# run NP TP PP NAME [--set ...]: tptrain, metrics in $W/NAME.jsonl, log in $W/NAME.log (its tail
# printed on failure unless EXPECT_FAIL is set)
run() {
  local np=$1 tp=$2 pp=$3 name=$4; shift 4
  timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" \
    --set parallel.tensor_model_parallel_size=$tp --set parallel.pipeline_model_parallel_size=$pp \
    --set logging.metrics_file="$W/$name.jsonl" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || [ -n "${EXPECT_FAIL:-}" ] || { echo "  $name: tptrain exited $rc"; tail -15 "$W/$name.log"; }
  return $rc
}
# compare REF OTHER REL NAME: OTHER (resumed at iteration 5: iterations 6..10 only) against REF's
# same iterations, lm loss and grad norm within REL (0: bitwise)
compare() {
  local ref=$1 other=$2 rel=$3 name=$4 its out
  its=$(grep -o '"iteration":[0-9]*' "$other" | cut -d: -f2 | tr '\n' ' ')
  [ "$its" = "6 7 8 9 10 " ] || { bad "$name: resumed run logged iterations '$its', want 6..10"; return 1; }
  grep -E '"iteration":(6|7|8|9|10),' "$ref" > "$W/$name.ref.jsonl"  # keys are sorted: "iteration" then ","
  grep -E '"iteration":(6|7|8|9|10)[,}]' "$ref" | cmp -s - "$W/$name.ref.jsonl" || { bad "$name: reading $ref"; return 1; }
  if out=$($PY "$CMP" "$W/$name.ref.jsonl" "$other" --rel "$rel" --min-iters 5); then ok "$name"
  else bad "$name"; fi
  echo "$out"
}
# params REF_CKPT OTHER_CKPT REL NAME [--kind all]: final tensors of two checkpoints within REL
params() {
  local ref=$1 other=$2 rel=$3 name=$4 out; shift 4
  if out=$($PY "$CKT" compare "$ref" "$other" --rel "$rel" "$@" 2>&1); then ok "$name"; else bad "$name"; fi
  echo "$out" | tail -4
}

# --- (a) TP2 x PP2: 10 straight vs 5 + a resume of 5, bitwise ------------------------------------
run 4 2 2 straight --set checkpoint.save="$W/ck_straight" || bad "straight TP2xPP2 run"
run 4 2 2 first --set training.train_iters=5 --set checkpoint.save="$W/ck_first" &&
  run 4 2 2 resume --set checkpoint.load="$W/ck_first" --set checkpoint.save="$W/ck_resume" ||
  bad "TP2xPP2: 5 iterations saved, resumed to 10"
[ "$(cat "$W/ck_first/latest_checkpointed_iteration.txt" 2>/dev/null)" = 5 ] &&
  grep -q "^loaded checkpoint $W/ck_first/iter_0000005 at iteration 5" "$W/resume.log" && ok "the first run saved iteration 5, the resume loaded it" ||
  { bad "checkpoint at iteration 5"; grep -i "load" "$W/resume.log" | head -3; }
compare "$W/straight.jsonl" "$W/resume.jsonl" 0 "TP2xPP2: 5 + resume 5 bitwise equal to 10 straight (lm loss, grad norm)"
params "$W/ck_straight" "$W/ck_resume" 0 "TP2xPP2: final parameters and Adam moments of the resumed run bitwise the straight run's" --kind all

# --- (b) the TP2 x PP2 checkpoint resumed at TP1 x PP1 and TP2 x PP1 (G = 2: one group per rank) ---
if run 1 1 1 cross_1rank --set checkpoint.load="$W/ck_first" --set checkpoint.save="$W/ck_cross_1rank" \
    --set training.micro_batch_size=8; then
  compare "$W/straight.jsonl" "$W/cross_1rank.jsonl" 1e-5 "saved TP2xPP2, resumed at TP1xPP1 (1e-5)"
  params "$W/ck_straight" "$W/ck_cross_1rank" 1e-5 "saved TP2xPP2, resumed at TP1xPP1: final parameters (1e-5)"
else bad "saved TP2xPP2, resumed at TP1xPP1"; fi
if run 2 2 1 cross_tp2 --set checkpoint.load="$W/ck_first" --set checkpoint.save="$W/ck_cross_tp2" \
    --set training.micro_batch_size=8; then
  compare "$W/straight.jsonl" "$W/cross_tp2.jsonl" 1e-5 "saved TP2xPP2, resumed at TP2xPP1 (1e-5)"
  params "$W/ck_straight" "$W/ck_cross_tp2" 1e-5 "saved TP2xPP2, resumed at TP2xPP1: final parameters (1e-5)"
else bad "saved TP2xPP2, resumed at TP2xPP1"; fi

# --- (e) the q/k norms: resumed across layouts (generate from its checkpoint in (c)) ---------------
QK=(--set model.qk_layernorm=true)
run 4 2 2 qk_straight "${QK[@]}" --set checkpoint.save="$W/ck_qk_straight" || bad "straight TP2xPP2 run with qk_layernorm"
if run 4 2 2 qk_first "${QK[@]}" --set training.train_iters=5 --set checkpoint.save="$W/ck_qk_first" &&
   run 1 1 1 qk_cross_1rank "${QK[@]}" --set checkpoint.load="$W/ck_qk_first" --set checkpoint.save="$W/ck_qk_cross_1rank" \
     --set training.micro_batch_size=8; then
  compare "$W/qk_straight.jsonl" "$W/qk_cross_1rank.jsonl" 1e-5 "qk_layernorm: saved TP2xPP2, resumed at TP1xPP1 (1e-5)"
  params "$W/ck_qk_straight" "$W/ck_qk_cross_1rank" 1e-5 "qk_layernorm: saved TP2xPP2, resumed at TP1xPP1: final parameters (1e-5)"
else bad "qk_layernorm: saved TP2xPP2, resumed at TP1xPP1"; fi

# --- (c) generate from the Llama checkpoints ------------------------------------------------------
# the same model trained longer (200 iterations at a higher learning rate, TP2 x PP2) so that greedy
# text is more than spaces or "the the"; up to 100 new tokens: the text fills the 64 positions (RoPE
# past the 16 trained on) unless the end of document comes first
PROMPT="The quick brown fox"
run 4 2 2 gen --set training.train_iters=200 --set optimizer.lr_decay_iters=200 --set optimizer.lr=1.0e-2 \
  --set optimizer.min_lr=1.0e-3 --set checkpoint.save="$W/ck_gen" || bad "training the model for generate"
for name in gen straight resume qk_straight; do
  timeout 120 "$TPTRAIN" generate --checkpoint "$W/ck_$name" --prompt "$PROMPT" --temperature 0 --max-new-tokens 100 \
    --threads 1 > "$W/greedy_$name.txt" 2> "$W/greedy_$name.err" || { bad "generate from ck_$name exited $?"; cat "$W/greedy_$name.err"; }
done
echo "     greedy (200 iterations): $(head -c 200 "$W/greedy_gen.txt")"
echo "     greedy (10 iterations): $(head -c 200 "$W/greedy_straight.txt")"
if grep -q "^$PROMPT" "$W/greedy_gen.txt" && tail -c +$(( ${#PROMPT} + 1 )) "$W/greedy_gen.txt" | grep -q '[a-z]'; then
  ok "generate prints the prompt and a continuation with letters ($(tail -1 "$W/greedy_gen.err" | sed 's/^generate: //'))"
else bad "generate output"; cat "$W/greedy_gen.txt" "$W/greedy_gen.err"; fi
grep -q "saved on TP 2 x PP 2 x DP 1" "$W/greedy_gen.err" && ok "generate names the saving layout (TP 2 x PP 2)" ||
  { bad "generate's log does not name the layout"; cat "$W/greedy_gen.err"; }
grep -q "^$PROMPT" "$W/greedy_straight.txt" && cmp -s "$W/greedy_straight.txt" "$W/greedy_resume.txt" &&
  ok "greedy text from the 10-iteration straight and resumed checkpoints identical" ||
  { bad "greedy text of the straight / resumed checkpoints"; cat "$W/greedy_straight.txt" "$W/greedy_resume.txt"; }
# the reference model on the checkpoint's tensors, the whole text at once (no KV cache): every token
# generate chose is the best (up to a 1e-4 tie), and generate stopped where its rules say
for name in gen straight qk_straight; do
  if out=$($PY "$TPTRAIN_SRC/tests/reference/greedy.py" --checkpoint "$W/ck_$name" --prompt "$PROMPT" \
      --max-new-tokens 100 --check "$W/greedy_$name.txt" 2>&1
  ); then ok "ck_$name: generate's greedy tokens are the reference model's best (no KV cache, checkpoint tensors)"
  else bad "ck_$name: generate vs the reference model"; fi
  echo "$out" | tail -3
done

# --- (d) G = 2 at TP 4: G % TP != 0 --------------------------------------------------------------
EXPECT_FAIL=1 run 4 4 1 tp4 --set checkpoint.load="$W/ck_first" --set training.micro_batch_size=4; rc=$?
if [ $rc -eq 2 ] && grep -q "model.num_query_groups" "$W/tp4.log" && grep -q "parallel.tensor_model_parallel_size" "$W/tp4.log"; then
  ok "the G = 2 checkpoint at TP 4: exit 2, $(grep -m1 "num_query_groups" "$W/tp4.log" | cut -c1-200)"
else bad "G = 2 at TP 4: exit $rc, want 2 naming model.num_query_groups and parallel.tensor_model_parallel_size"; fi
# and with G = 4 (valid at TP 4) the saved QKV [2, 6, 8, 64] is not the model's [4, 4, 8, 64]
EXPECT_FAIL=1 run 4 4 1 tp4_g4 --set checkpoint.load="$W/ck_first" --set training.micro_batch_size=4 --set model.num_query_groups=4; rc=$?
if [ $rc -eq 2 ] && grep -q "does not match the model: tensor 'h.0.attn.qkv.weight'" "$W/tp4_g4.log"; then
  ok "the G = 2 checkpoint loaded with G = 4: exit 2, $(grep -m1 "does not match the model" "$W/tp4_g4.log" | sed 's/.*: tensor/tensor/' | cut -c1-200)"
else bad "G = 2 checkpoint loaded with G = 4: exit $rc, want 2 naming attn.qkv.weight"; fi

finish
