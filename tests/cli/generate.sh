#!/usr/bin/env bash
# tptrain generate (docs/ARCHITECTURE.md "Command line and exit status"): a tiny byte-level model trained on a small text at
# 1 rank, TP2, PP2 and TP2 x PP2 (same config, same data: the same weights up to 1e-5); greedy
# generation from each checkpoint is the same text, and the PyTorch reference's greedy continuation
# (tests/reference/greedy.py on the `tptrain export`ed weights) is that text too. Also: sampling is
# seeded, the position limit and bad input stop with a message, and GPT-2 BPE vocabulary files work
# end to end (preprocess -> train -> generate).
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1

# A small text: documents separated by blank lines.
cat > "$W/text.txt" <<'TEXT'
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.

A cat sat on the mat. The cat saw a rat. The rat ran to the barn.

Twinkle, twinkle, little star, how I wonder what you are.

Row, row, row your boat, gently down the stream. Merrily, merrily, merrily, merrily, life is but a dream.

The rain in Spain stays mainly in the plain.

Early to bed and early to rise makes a man healthy, wealthy and wise.

The quick brown fox likes the sun. The lazy dog likes the mat.

Jack and Jill went up the hill to fetch a pail of water.

Humpty Dumpty sat on a wall. Humpty Dumpty had a great fall.

Mary had a little lamb, its fleece was white as snow.

The cat and the fox ran over the hill to the barn in the rain.
TEXT
if "$TPTRAIN" preprocess --input "$W/text.txt" --output-prefix "$W/text" --append-eod > "$W/pre.log" 2>&1; then
  ok "preprocess: $(tail -1 "$W/pre.log")"
else bad "preprocess"; cat "$W/pre.log"; fi

cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 64, vocab_size: 257,
        make_vocab_size_divisible_by: 64}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 40, precision: fp32, seed: 5, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 1.0e-4, lr_warmup_iters: 4, weight_decay: 0.1, clip_grad: 1.0}
data: {path: $W/text, shuffle: true, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 10}
YAML

layouts="single:1:1:1 tp2:2:2:1 pp2:2:1:2 tp2pp2:4:2:2"
for l in $layouts; do
  IFS=: read -r name np tp pp <<< "$l"
  if timeout 300 mpirun -np "$np" "$TPTRAIN" --config "$W/cfg.yaml" --set parallel.tensor_model_parallel_size=$tp \
      --set parallel.pipeline_model_parallel_size=$pp --set checkpoint.save="$W/ck_$name" \
      --set logging.metrics_file="$W/$name.jsonl" > "$W/train_$name.log" 2>&1; then
    ok "train $name (TP $tp x PP $pp): $(grep -o 'lm loss [0-9.E+-]*' "$W/train_$name.log" | sed -n '1p;$p' | paste -sd' ' | sed 's/ lm loss/ ->/')"
  else bad "train $name"; tail -15 "$W/train_$name.log"; fi
done

PROMPT="The quick brown fox"
for l in $layouts; do
  IFS=: read -r name _ <<< "$l"
  timeout 120 "$TPTRAIN" generate --checkpoint "$W/ck_$name" --prompt "$PROMPT" --temperature 0 --max-new-tokens 60 \
    > "$W/greedy_$name.txt" 2> "$W/greedy_$name.err" || { bad "generate from $name"; cat "$W/greedy_$name.err"; }
done
echo "     greedy: $(cat "$W/greedy_single.txt")"
grep -q "^$PROMPT" "$W/greedy_single.txt" && [ "$(wc -c < "$W/greedy_single.txt")" -gt $(( ${#PROMPT} + 10 )) ] &&
  ok "generate prints the prompt and its continuation ($(tail -1 "$W/greedy_single.err" | sed 's/^generate: //'))" ||
  { bad "generate output"; cat "$W/greedy_single.txt" "$W/greedy_single.err"; }
same=1
for l in $layouts; do
  IFS=: read -r name _ <<< "$l"
  cmp -s "$W/greedy_single.txt" "$W/greedy_$name.txt" || { same=0; echo "     $name: $(cat "$W/greedy_$name.txt")"; }
done
[ $same = 1 ] && ok "greedy text identical from the checkpoints of 1 rank, TP2, PP2, TP2xPP2" || bad "greedy text differs between layouts"
grep -q "saved on TP 2 x PP 2 x DP 1" "$W/greedy_tp2pp2.err" && ok "generate names the saving layout" || { bad "layout in log"; cat "$W/greedy_tp2pp2.err"; }

# an iter_N directory gives the same text
timeout 120 "$TPTRAIN" generate --checkpoint "$W/ck_tp2pp2/iter_0000040" --prompt "$PROMPT" --temperature 0 \
  --max-new-tokens 60 > "$W/greedy_iter.txt" 2> "$W/greedy_iter.err" && cmp -s "$W/greedy_single.txt" "$W/greedy_iter.txt" &&
  ok "generate --checkpoint <iter_N dir>: the same text" || { bad "generate from iter_N"; cat "$W/greedy_iter.err"; }

# the PyTorch reference from the exported weights (1 rank and TP2 x PP2 checkpoints)
for name in single tp2pp2; do
  timeout 120 "$TPTRAIN" export --checkpoint "$W/ck_$name" --output "$W/hf_$name" > "$W/export_$name.log" 2>&1
done
# (a few dozen steps on a tiny text at a high learning rate: beyond that the layouts' rounding differences
# grow past 1e-5, and greedy text need not agree any more)
out=$($PY "$TPTRAIN_SRC/tests/tools/compare_params.py" "$W/hf_single/model.safetensors" "$W/hf_tp2pp2/model.safetensors" \
      --rel 1e-5 2>&1) && ok "the layouts trained the same weights (TP2xPP2 vs 1 rank: $(echo "$out" | tail -1 | sed 's/^ *//'))" ||
  { bad "weights of TP2xPP2 vs 1 rank"; echo "$out" | tail -5; }
for name in single tp2pp2; do
  if timeout 300 $PY "$TPTRAIN_SRC/tests/reference/greedy.py" --model "$W/hf_$name" --prompt "$PROMPT" \
       --max-new-tokens 60 > "$W/ref_$name.txt" 2> "$W/ref_$name.err"; then
    if cmp -s "$W/greedy_$name.txt" "$W/ref_$name.txt"; then
      ok "PyTorch reference's greedy continuation from the export of $name = tptrain generate ($(tail -1 "$W/ref_$name.err" | sed 's/^greedy.py: //'))"
    else bad "reference greedy ($name) differs"; echo "     reference: $(cat "$W/ref_$name.txt")"; cat "$W/ref_$name.err"; fi
  else bad "export / greedy.py for $name"; cat "$W/export_$name.log" "$W/ref_$name.err" 2>/dev/null | tail -10; fi
done

# the empty prompt starts from the end-of-document token, in both
timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_single" --prompt "" --temperature 0 --max-new-tokens 30 \
  > "$W/empty.txt" 2> "$W/empty.err" &&
  timeout 300 $PY "$TPTRAIN_SRC/tests/reference/greedy.py" --model "$W/hf_single" --prompt "" --max-new-tokens 30 \
    > "$W/empty_ref.txt" 2>/dev/null && cmp -s "$W/empty.txt" "$W/empty_ref.txt" &&
  ok "empty prompt: '$(head -c 40 "$W/empty.txt" | tr '\n' ' ')' = reference" ||
  { bad "empty prompt"; cat "$W/empty.txt" "$W/empty.err" "$W/empty_ref.txt"; }

# sampling: seeded (same seed, same text; the layout does not matter), another seed another text
gen() { timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_$1" --prompt "$PROMPT" --temperature 0.8 --top-k 20 \
          --seed "$2" --max-new-tokens 80 2>/dev/null; }
s1=$(gen single 7); s2=$(gen tp2pp2 7); s3=$(gen single 8)
[ -n "$s1" ] && [ "$s1" = "$s2" ] && [ "$s1" != "$s3" ] &&
  ok "sampling (temperature 0.8, top-k 20) is a function of the seed: '$(echo "$s1" | head -1)'" ||
  { bad "seeded sampling"; printf '%s\n---\n%s\n---\n%s\n' "$s1" "$s2" "$s3"; }

# positions: the text stops at max_position_embeddings (64) + 1 tokens; a longer prompt is an error
long=$(printf 'the cat sat %.0s' 1 2 3 4)  # 48 bytes
timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_single" --prompt "$long" --temperature 0 --max-new-tokens 100 \
  > "$W/pos.txt" 2> "$W/pos.err"
n=$(( $(wc -c < "$W/pos.txt") - 1 ))
if grep -q "stopped: the text fills max_position_embeddings (64 tokens)" "$W/pos.err"; then
  [ "$n" -eq 65 ] && ok "generation stops when the text fills the positions (65 bytes: 64 fed + the last)" || bad "positions: $n bytes"
elif grep -q "stopped: end-of-document token" "$W/pos.err" && [ "$n" -le 65 ]; then
  ok "generation stopped at the end-of-document token within the positions"
else bad "position limit"; cat "$W/pos.err"; fi
timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_single" --prompt "$(printf 'x%.0s' $(seq 80))" > "$W/long.txt" 2>&1
[ $? -eq 2 ] && grep -q "the prompt has 80 tokens; the model's max_position_embeddings is 64" "$W/long.txt" &&
  ok "a prompt longer than the positions: exit 2" || { bad "long prompt"; cat "$W/long.txt"; }

# bad input: exit 2 with a message
timeout 60 "$TPTRAIN" generate --checkpoint "$W/nothing" --prompt x > "$W/bad1.txt" 2>&1
[ $? -eq 2 ] && grep -q "no checkpoint in $W/nothing" "$W/bad1.txt" && ok "no checkpoint: exit 2" || { bad "no checkpoint"; cat "$W/bad1.txt"; }
timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_single" > "$W/bad2.txt" 2>&1
[ $? -eq 2 ] && grep -q -- "--prompt is required" "$W/bad2.txt" && ok "no --prompt: exit 2" || { bad "no prompt"; cat "$W/bad2.txt"; }
timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_single" --prompt x --temperature hot > "$W/bad3.txt" 2>&1
[ $? -eq 2 ] && grep -q -- "--temperature: expected a finite number" "$W/bad3.txt" && ok "bad --temperature: exit 2" || { bad "bad temperature"; cat "$W/bad3.txt"; }

# GPT-2 BPE end to end: a vocabulary of every byte (GPT-2's bytes_to_unicode), merges of frequent
# pairs of the text and <|endoftext|>; preprocess with it, check the tokens decode to the documents,
# train a little, generate.
if $PY - "$W" <<'PY'
import json, sys
from collections import Counter
W = sys.argv[1]
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
sym = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {sym[b]: b for b in range(256)}
text = open(W + "/text.txt", "rb").read()
words = [[sym[b] for b in w] for w in text.replace(b"\n", b" ").split(b" ") if w]
merges = []
for _ in range(40):  # byte pair encoding "training" within words
    pairs = Counter(p for w in words for p in zip(w, w[1:]))
    if not pairs:
        break
    (a, b), _ = pairs.most_common(1)[0]
    merges.append(f"{a} {b}")
    vocab[a + b] = len(vocab)
    words = [[*w] for w in words]
    for w in words:
        i = 0
        while i < len(w) - 1:
            if w[i] == a and w[i + 1] == b:
                w[i:i + 2] = [a + b]
            i += 1
vocab["<|endoftext|>"] = len(vocab)
json.dump(vocab, open(W + "/vocab.json", "w"), ensure_ascii=False)
open(W + "/merges.txt", "w").write("#version: 0.2\n" + "\n".join(merges) + "\n")
print(len(vocab))
PY
then
  V=$($PY -c "import json; print(len(json.load(open('$W/vocab.json'))))")
  if "$TPTRAIN" preprocess --input "$W/text.txt" --output-prefix "$W/bpe" --append-eod --vocab-file "$W/vocab.json" \
      --merge-file "$W/merges.txt" > "$W/bpe_pre.log" 2>&1 &&
     $PY - "$W" <<'PY'
import json, struct, sys
import numpy as np
W = sys.argv[1]
inv = {v: k for k, v in json.load(open(W + "/vocab.json")).items()}
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
byte_of = {chr(c): b for b, c in zip(bs, cs)}
idx = open(W + "/bpe.idx", "rb").read()
nseq = struct.unpack_from("<Q", idx, 18)[0]
sizes = np.frombuffer(idx, "<i4", nseq, 34)
tokens = np.fromfile(W + "/bpe.bin", "<u2")
docs = open(W + "/text.txt").read().strip("\n").split("\n\n")
eod = len(inv) - 1
pos = 0
for d, s in zip(docs, sizes):
    t = tokens[pos:pos + s].tolist(); pos += s
    assert t[-1] == eod, "no EOD at the end of a document"
    got = bytes(byte_of[ch] for i in t[:-1] for ch in inv[i]).decode()
    assert got == d, (got, d)
assert len(docs) == nseq
print(f"  {nseq} documents, {len(tokens)} BPE tokens for {sum(len(d.encode()) + 1 for d in docs)} byte-level ones")
PY
  then ok "preprocess --vocab-file/--merge-file: tokens decode to the documents ($V ids)"
  else bad "BPE preprocess"; cat "$W/bpe_pre.log"; fi
  if timeout 300 mpirun -np 2 "$TPTRAIN" --config "$W/cfg.yaml" --set model.vocab_size=$V --set data.path="$W/bpe" \
       --set parallel.tensor_model_parallel_size=2 --set training.train_iters=20 --set checkpoint.save="$W/ck_bpe" \
       > "$W/train_bpe.log" 2>&1 &&
     timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_bpe" --prompt "$PROMPT" --temperature 0 --max-new-tokens 20 \
       --vocab-file "$W/vocab.json" --merge-file "$W/merges.txt" > "$W/bpe_gen.txt" 2> "$W/bpe_gen.err" &&
     grep -q "^$PROMPT" "$W/bpe_gen.txt" && grep -q "GPT-2 BPE tokenizer" "$W/bpe_gen.err"; then
    ok "BPE model (TP2) -> generate --vocab-file/--merge-file: $(cat "$W/bpe_gen.txt")"
  else bad "BPE train / generate"; tail -5 "$W/train_bpe.log"; cat "$W/bpe_gen.err" 2>/dev/null; fi
  timeout 60 "$TPTRAIN" generate --checkpoint "$W/ck_bpe" --prompt x > "$W/bad4.txt" 2>&1
  [ $? -eq 2 ] && grep -q "vocab_size $V; the byte-level tokenizer needs 257" "$W/bad4.txt" &&
    ok "a BPE model without --vocab-file: exit 2" || { bad "BPE model without vocab"; cat "$W/bad4.txt"; }
else bad "writing the BPE vocabulary"; fi

finish
