#!/usr/bin/env bash
# Llama 3's tokenizer in `tptrain preprocess` and `tptrain generate` (data/byte_pair_tokenizer.h).
#  1. Without PyPI, on a small tiktoken file learned from a text (tests/reference/llama3_tokenizer_ref.py
#     synthetic) and its Hugging Face conversion (to-hf): --tokenizer-model and --tokenizer-file write
#     the same dataset, <|begin_of_text|> first and <|end_of_text|> last; the same bytes on 1, 2 and 3
#     threads; malformed tokenizer files and option clashes exit 2 naming the problem; a Llama-shaped
#     model trained on the data generates the same text with either file, and a model whose
#     vocabulary is smaller than the tokenizer's exits 2.
#  2. With Meta's tokenizer.model (the llama-models wheel) and OpenAI's tiktoken, both fetched from
#     PyPI once into the build directory (LLAMA3_TOKENIZER_CACHE to change; skipped with a message
#     where PyPI cannot be reached): the published vector "This is a test sentence." ->
#     [128000, 2028, 374, 264, 1296, 11914, 13, 128001]; every fortune of Debian's fortunes packages
#     and a Unicode stress text give tiktoken's ids (int32 .bin); the tokenizer.json built from the
#     file gives the same dataset; the preprocessing speed on the fortunes with 1 and 2 threads (the
#     same output); generate with the real vocabulary (128256) from either file.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
REF="$TPTRAIN_SRC/tests/reference/llama3_tokenizer_ref.py"
cd "$W" || exit 1

# tiny Llama-shaped model config: cfg FILE VOCAB DATA EOD
cfg() {
  cat > "$1" <<YAML
model: {num_layers: 2, hidden_size: 32, ffn_hidden_size: 64, num_attention_heads: 4, group_query_attention: true,
        num_query_groups: 2, seq_length: 32, vocab_size: $2, make_vocab_size_divisible_by: 64,
        normalization: RMSNorm, swiglu: true, position_embedding_type: rope, untie_embeddings_and_output_weights: true,
        add_bias_linear: false}
training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 12, precision: fp32, seed: 5, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 1.0e-4, lr_warmup_iters: 2, weight_decay: 0.1, clip_grad: 1.0}
data: {path: $3, shuffle: true, split: [100, 0, 0], eval_iters: 0, eod_token_id: $4}
logging: {log_interval: 4}
YAML
}

# =============================== 1. a small tiktoken file, no PyPI ===============================
cat > text.txt <<'TEXT'
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.

A cat sat on the mat. The cat saw a rat. The rat ran to the barn.

Twinkle, twinkle, little star, how I wonder what you are. It's 12:30 -- isn't it?

Row, row, row your boat, gently down the stream. Merrily, merrily, merrily, merrily, life is but a dream.

The rain in Spain stays mainly in the plain. Café crème, 100 euros, 日本語 🙂.

Early to bed and early to rise makes a man healthy, wealthy and wise.

The quick brown fox likes the sun. The lazy dog likes the mat. <|end_of_text|> is text here.

Jack and Jill went up the hill to fetch a pail of water.
TEXT
for i in 1 2 3 4 5 6; do cat text.txt; echo; done > text6.txt
if $PY "$REF" synthetic text.txt syn.model --merges 80 > syn.log 2>&1 && $PY "$REF" to-hf syn.model syn.json >> syn.log 2>&1
then ok "$(head -1 syn.log | sed 's/^synthetic: //')"; else bad "synthetic tokenizer"; cat syn.log; fi
N=$(grep -c . syn.model); V=$((N + 256)); BOS=$N; EOT=$((N + 1))

"$TPTRAIN" preprocess --input text6.txt --output-prefix syn_model --append-eod --tokenizer-model syn.model \
  --workers 1 > pre_model.log 2>&1 && ok "preprocess --tokenizer-model: $(tail -1 pre_model.log | sed 's/^preprocess: //')" ||
  { bad "preprocess --tokenizer-model"; cat pre_model.log; }
"$TPTRAIN" preprocess --input text6.txt --output-prefix syn_json --append-eod --tokenizer-file syn.json \
  --tokenizer-type HuggingFaceTokenizer > pre_json.log 2>&1 || { bad "preprocess --tokenizer-file"; cat pre_json.log; }
same_dataset "--tokenizer-file (the Hugging Face conversion) writes the --tokenizer-model dataset" syn_model syn_json
for t in 2 3; do
  "$TPTRAIN" preprocess --input text6.txt --output-prefix syn_t$t --append-eod --tokenizer-model syn.model \
    --workers $t > /dev/null 2>&1
  same_dataset "--workers $t: the same bytes as 1 thread" syn_model syn_t$t
done
if out=$($PY - "$BOS" "$EOT" <<'PY'
import struct, sys
import numpy as np
bos, eot = int(sys.argv[1]), int(sys.argv[2])
idx = open("syn_model.idx", "rb").read()
dtype = idx[17]; nseq = struct.unpack_from("<Q", idx, 18)[0]
sizes = np.frombuffer(idx, "<i4", nseq, 34)
tokens = np.fromfile("syn_model.bin", "<u2")
assert dtype == 8, dtype  # uint16 below 65500 ids
pos = 0
for s in sizes:
    d = tokens[pos:pos + s]; pos += s
    assert d[0] == bos and d[-1] == eot and bos not in d[1:-1] and eot not in d[1:-1], d
print(f"{nseq} documents: {bos} first, {eot} last, uint16; {len(tokens)} tokens")
PY
); then ok "documents: <|begin_of_text|> ... <|end_of_text|>: $out"; else bad "document framing"; echo "$out"; fi

# ---- malformed files and option clashes: exit 2 naming the problem
{ cat syn.model; echo "not*base64 $N"; } > bad_b64.model
{ cat syn.model; echo "QUJD $((N - 1))"; } > dup_rank.model
$PY -c "import json; j = json.load(open('syn.json')); del j['model']['vocab']; json.dump(j, open('novocab.json', 'w'))"
$PY -c "import json; j = json.load(open('syn.json')); del j['model']['merges']; json.dump(j, open('nomerges.json', 'w'))"
$PY -c "import json; j = json.load(open('syn.json')); j['pre_tokenizer'] = {'type': 'Whitespace'}; json.dump(j, open('ws.json', 'w'))"
P=(preprocess --input text.txt --output-prefix bad_out)
expect_exit2 bad_base64 "bad_b64.model:$((N + 1)): bad base64" "$TPTRAIN" "${P[@]}" --tokenizer-model bad_b64.model
expect_exit2 duplicate_rank "duplicate rank $((N - 1))" "$TPTRAIN" "${P[@]}" --tokenizer-model dup_rank.model
expect_exit2 json_without_vocab "no model.vocab" "$TPTRAIN" "${P[@]}" --tokenizer-file novocab.json
expect_exit2 json_without_merges "no model.merges" "$TPTRAIN" "${P[@]}" --tokenizer-file nomerges.json
expect_exit2 unknown_pretokenizer "unknown pre-tokenizer Whitespace" "$TPTRAIN" "${P[@]}" --tokenizer-file ws.json
expect_exit2 not_json "not valid JSON" "$TPTRAIN" "${P[@]}" --tokenizer-file syn.model
expect_exit2 missing_file "--tokenizer-model: cannot open nothing.model: No such file" "$TPTRAIN" "${P[@]}" --tokenizer-model nothing.model
# ranks and ids bounded by what the file holds (not a 16 GiB table and bad_alloc)
{ cat syn.model; echo "QUJD 2147483648"; } > huge_rank.model
{ cat syn.model; echo "QUJD 1073741800"; } > big_rank.model
$PY -c "import json; j = json.load(open('syn.json')); j['added_tokens'][1]['id'] = 2**30 - 1; json.dump(j, open('huge_id.json', 'w'))"
$PY -c "import json; j = json.load(open('syn.json')); j['model']['vocab']['zz'] = 10**6; json.dump(j, open('huge_vocab_id.json', 'w'))"
expect_exit2 rank_2_31 "huge_rank.model:$((N + 1)): rank 2147483648 is past the file's" "$TPTRAIN" "${P[@]}" --tokenizer-model huge_rank.model
expect_exit2 rank_2_30 "big_rank.model:$((N + 1)): rank 1073741800 is past the file's" "$TPTRAIN" "${P[@]}" --tokenizer-model big_rank.model
expect_exit2 added_id_2_30 "id 1073741823 is out of range for the file's" "$TPTRAIN" "${P[@]}" --tokenizer-file huge_id.json
expect_exit2 vocab_id_10_6 "model.vocab: token \"zz\": id 1000000 is out of range for the file's" "$TPTRAIN" "${P[@]}" --tokenizer-file huge_vocab_id.json
# file kinds: a device, a FIFO (which would block), a folder: refused at once, naming the kind
mkfifo fifo.model
expect_exit2 dev_zero "--tokenizer-model: /dev/zero: not a regular file (a character device)" \
  timeout 60 "$TPTRAIN" "${P[@]}" --tokenizer-model /dev/zero
expect_exit2 fifo_model "--tokenizer-model: fifo.model: not a regular file (a FIFO)" timeout 60 "$TPTRAIN" "${P[@]}" --tokenizer-model fifo.model
expect_exit2 dir_json "--tokenizer-file: $W: not a regular file (a directory)" timeout 60 "$TPTRAIN" "${P[@]}" --tokenizer-file "$W"
expect_exit2 fifo_input "preprocess: --input: fifo.model: not a regular file (a FIFO)" \
  timeout 60 "$TPTRAIN" preprocess --input fifo.model --output-prefix bad_out --tokenizer-model syn.model
expect_exit2 two_tokenizers "excludes" "$TPTRAIN" "${P[@]}" --tokenizer-model syn.model --tokenizer-file syn.json
expect_exit2 tiktokenizer_type "needs --tokenizer-model" "$TPTRAIN" "${P[@]}" --tokenizer-type TikTokenizer
[ ! -e bad_out.bin ] && [ ! -e bad_out.idx ] && ok "nothing written on bad input" || bad "bad input left bad_out.*"

# ---- a Llama-shaped model on these tokens: generate with either file; a smaller vocabulary exits 2
cfg syn.yaml "$V" "$W/syn_model" "$EOT"
if timeout 300 "$TPTRAIN" --config syn.yaml --set checkpoint.save="$W/ck_syn" > train_syn.log 2>&1; then
  ok "train on the tokens (vocab_size $V): $(grep -o 'lm loss [0-9.E+-]*' train_syn.log | sed -n '1p;$p' | paste -sd' ')"
else bad "train on the synthetic tokens"; tail -5 train_syn.log; fi
G=(generate --checkpoint "$W/ck_syn" --prompt "The quick brown" --temperature 0 --max-new-tokens 12)
timeout 120 "$TPTRAIN" "${G[@]}" --tokenizer-model syn.model > gen_model.txt 2> gen_model.err
timeout 120 "$TPTRAIN" "${G[@]}" --tokenizer-file syn.json > gen_json.txt 2> gen_json.err
if grep -q "^The quick brown" gen_model.txt && cmp -s gen_model.txt gen_json.txt && grep -q "Llama 3 tiktoken" gen_model.err
then ok "generate --tokenizer-model = --tokenizer-file: '$(head -c 80 gen_model.txt | tr '\n' ' ')'"
else bad "generate with the synthetic tokenizer"; cat gen_model.txt gen_model.err gen_json.txt gen_json.err | head -20; fi
"$TPTRAIN" preprocess --input text.txt --output-prefix bytes --append-eod > /dev/null 2>&1
cfg bytes.yaml 257 "$W/bytes" 256
timeout 300 "$TPTRAIN" --config bytes.yaml --set training.train_iters=2 --set checkpoint.save="$W/ck_bytes" > train_bytes.log 2>&1 ||
  { bad "train the byte-level model"; tail -5 train_bytes.log; }
expect_exit2 generate_vocab_mismatch "is larger than the model's vocab_size 257" \
  "$TPTRAIN" generate --checkpoint "$W/ck_bytes" --prompt "The" --tokenizer-model syn.model
expect_exit2 generate_byte_level_on_llama "has vocab_size $V; the byte-level tokenizer needs 257" \
  "$TPTRAIN" generate --checkpoint "$W/ck_syn" --prompt "The"
expect_exit2 generate_dev_zero "--tokenizer-model: /dev/zero: not a regular file (a character device)" \
  timeout 60 "$TPTRAIN" "${G[@]}" --tokenizer-model /dev/zero
expect_exit2 generate_fifo "--tokenizer-file: fifo.model: not a regular file (a FIFO)" \
  timeout 60 "$TPTRAIN" "${G[@]}" --tokenizer-file fifo.model
expect_exit2 generate_huge_rank "rank 2147483648 is past the file's" "$TPTRAIN" "${G[@]}" --tokenizer-model huge_rank.model

# ======================= 2. Meta's tokenizer.model against tiktoken (PyPI) =======================
CACHE=${LLAMA3_TOKENIZER_CACHE:-$(dirname "$TPTRAIN")/llama3_tokenizer_cache}
fetch_reference "the tiktoken comparison with Meta's Llama 3 tokenizer.model" "$CACHE"
TM=$CACHE/tokenizer.model

# ---- the published vector (llama-models' test_tokenizer.py)
printf 'This is a test sentence.\n' > vector.txt
"$TPTRAIN" preprocess --input vector.txt --output-prefix vector --append-eod --tokenizer-model "$TM" > vector.log 2>&1
got=$($PY -c "import numpy as np; print(np.fromfile('vector.bin', '<i4').tolist())" 2>&1)
[ "$got" = "[128000, 2028, 374, 264, 1296, 11914, 13, 128001]" ] &&
  ok "\"This is a test sentence.\" -> $got (int32 .bin)" || { bad "published vector: $got"; cat vector.log; }

# ---- every fortune, and the Unicode stress text, against tiktoken
fortune_files
$PY "$REF" stress stress.jsonl > stress.log 2>&1 || { bad "stress text"; cat stress.log; }
if [ ${#FORTUNES[@]} -eq 0 ]; then
  bad "no fortunes in /usr/share/games/fortunes (apt-get install fortunes-min fortunes, or scripts/setup.sh)"
else
  for t in 1 2; do
    "$TPTRAIN" preprocess --input "${FORTUNES[@]}" --output-prefix fortunes_w$t --append-eod --tokenizer-model "$TM" \
      --workers $t > fortunes_w$t.log 2>&1 || { bad "preprocess the fortunes (--workers $t)"; tail -3 fortunes_w$t.log; }
  done
  speed1=$(grep -o '[0-9.]* MB of text.*per thread' fortunes_w1.log); speed2=$(grep -o '[0-9.]* MB of text.*per thread' fortunes_w2.log)
  echo "     speed: ${speed1:-?}"
  echo "     speed: ${speed2:-?}"
  per_thread=$(grep -o '[0-9.]* MB/s per thread' fortunes_w1.log | cut -d' ' -f1)
  $PY -c "import sys; sys.exit(0 if float('${per_thread:-0}') >= 1.0 else 1)" &&
    ok "preprocessing speed on one thread: ${per_thread} MB/s (>= 1 MB/s per core)" ||
    bad "preprocessing speed on one thread: ${per_thread:-?} MB/s, below 1 MB/s"
  same_dataset "fortunes: the same dataset on 1 and 2 threads" fortunes_w1 fortunes_w2
  out=$(timeout 600 $PY "$REF" compare "$TM" fortunes_w1 --inputs "${FORTUNES[@]}" --append-eod 2>&1) &&
    ok "every fortune (${#FORTUNES[@]} files): $out" || { bad "fortunes against tiktoken"; echo "$out" | head -12; }
fi
"$TPTRAIN" preprocess --input stress.jsonl --output-prefix stress --tokenizer-model "$TM" > stress_pre.log 2>&1 ||
  { bad "preprocess the stress text"; cat stress_pre.log; }
out=$(timeout 600 $PY "$REF" compare "$TM" stress --inputs stress.jsonl 2>&1) &&
  ok "Unicode stress text ($(sed 's/^stress: [^:]*: //' stress.log)): $out" || { bad "stress text against tiktoken"; echo "$out" | head -12; }

# ---- tokenizer.json built from tokenizer.model (Hugging Face's conversion): the same datasets
if $PY "$REF" to-hf "$TM" llama3.json > tohf.log 2>&1; then
  ok "$(sed 's/^to-hf: //' tohf.log)"
  "$TPTRAIN" preprocess --input stress.jsonl --output-prefix stress_json --tokenizer-file llama3.json > stress_json.log 2>&1 ||
    { bad "preprocess --tokenizer-file"; cat stress_json.log; }
  same_dataset "stress text: --tokenizer-file gives the --tokenizer-model ids" stress stress_json
  if [ ${#FORTUNES[@]} -gt 0 ]; then
    "$TPTRAIN" preprocess --input "${FORTUNES[@]}" --output-prefix fortunes_json --append-eod --tokenizer-file llama3.json \
      > fortunes_json.log 2>&1 || { bad "preprocess the fortunes --tokenizer-file"; tail -3 fortunes_json.log; }
    same_dataset "fortunes: --tokenizer-file gives the --tokenizer-model ids" fortunes_w1 fortunes_json
    echo "     tokenizer.json: $(grep -o 'loaded in.*per thread' fortunes_json.log)"
  fi
else bad "to-hf"; cat tohf.log; fi

# ---- generate with the real vocabulary, from either file
"$TPTRAIN" preprocess --input text6.txt --output-prefix llama_text --append-eod --tokenizer-model "$TM" > /dev/null 2>&1
cfg llama.yaml 128256 "$W/llama_text" 128001
if timeout 300 "$TPTRAIN" --config llama.yaml --set training.train_iters=4 --set checkpoint.save="$W/ck_llama" \
     > train_llama.log 2>&1; then
  G=(generate --checkpoint "$W/ck_llama" --prompt "The quick brown" --temperature 0 --max-new-tokens 6)
  timeout 120 "$TPTRAIN" "${G[@]}" --tokenizer-model "$TM" > gen_llama_model.txt 2> gen_llama_model.err
  timeout 120 "$TPTRAIN" "${G[@]}" --tokenizer-file llama3.json > gen_llama_json.txt 2> gen_llama_json.err
  if grep -q "^The quick brown" gen_llama_model.txt && cmp -s gen_llama_model.txt gen_llama_json.txt; then
    ok "generate on vocab 128256 (--tokenizer-model = --tokenizer-file): '$(head -c 80 gen_llama_model.txt | tr '\n' ' ')'"
  else bad "generate with the Llama 3 tokenizer"; cat gen_llama_model.* gen_llama_json.* | head -20; fi
else bad "train on Llama 3 tokens"; tail -5 train_llama.log; fi

finish
