#!/usr/bin/env bash
# llm.c's Llama 3 shards (magic 20240801, version 7, uint32 tokens) as data.path
# (data/corpus.cpp): tests/reference/make_llmc_llama3.py writes shards the way llm.c's
# write_datafile(..., "llama-3") does, and the same tokens as a Megatron int32 .bin/.idx (one
# document per shard). `tptrain data` reads from both exactly the samples the stream holds, and
# training on a Llama-shaped model (vocab 128256) loses the same on both, bit for bit; bad shards
# exit 2 naming the problem.
# Environment (ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
export PYTHONDONTWRITEBYTECODE=1
MAKE="$TPTRAIN_SRC/tests/reference/make_llmc_llama3.py"
cd "$W" || exit 1

if $PY "$MAKE" --tokens 6000 --shards 3 --llmc "$W/tok_" --megatron "$W/mega" --print-stream > stream.json 2> make.log
then ok "$(cat make.log)"; else bad "make_llmc_llama3.py"; cat make.log; fi
$PY "$MAKE" --tokens 1500 --llmc "$W/one_" --megatron "$W/one_mega" > /dev/null 2>&1

cat > cfg.yaml <<YAML
model: {num_layers: 2, hidden_size: 32, ffn_hidden_size: 64, num_attention_heads: 4, group_query_attention: true,
        num_query_groups: 2, seq_length: 32, vocab_size: 128256, make_vocab_size_divisible_by: 128,
        normalization: RMSNorm, swiglu: true, position_embedding_type: rope, untie_embeddings_and_output_weights: true,
        add_bias_linear: false}
training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 6, precision: fp32, seed: 3, cpu_threads: 1}
optimizer: {lr: 3.0e-3, min_lr: 1.0e-4, lr_warmup_iters: 2, weight_decay: 0.1, clip_grad: 1.0}
data: {path: $W/mega, shuffle: false, split: [100, 0, 0], eval_iters: 0, eod_token_id: 128001}
logging: {log_interval: 1}
YAML

# ---- tptrain data: the samples of the stream, from the shards and from the Megatron dataset
for src in "shards:$W/tok_*.bin" "megatron:$W/mega"; do
  name=${src%%:*}; path=${src#*:}
  "$TPTRAIN" data --config cfg.yaml --set "data.path=$path" --samples 0:187 --json > data_$name.jsonl 2> data_$name.err ||
    { bad "tptrain data on the $name"; cat data_$name.err; }
done
if out=$($PY - <<'PY'
import json
stream = json.load(open("stream.json"))
S, n = 32, (len(stream) - 1) // 32
for name in ("shards", "megatron"):
    rows = [json.loads(l) for l in open(f"data_{name}.jsonl")]
    assert len(rows) == 187 == n, (name, len(rows), n)
    for r in rows:
        i = r["sample"]
        assert r["tokens"] == stream[i * S:i * S + 16], (name, i, r["tokens"], stream[i * S:i * S + 16])
a = [(r["documents"], r["tokens"]) for r in map(json.loads, open("data_shards.jsonl"))]
b = [(r["documents"], r["tokens"]) for r in map(json.loads, open("data_megatron.jsonl"))]
assert a == b
big = sum(t > 65535 for r in a for t in r[1])
print(f"187 samples of 33 tokens: the stream's tokens and documents from both ({big} of the ids shown above 65535)")
PY
); then ok "tptrain data: $out"; else bad "tptrain data samples"; echo "$out" | tail -5; fi

# ---- training reads the same tokens: the same losses, bit for bit (also a single shard path)
for src in "shards:$W/tok_*.bin" "megatron:$W/mega" "one_shard:$W/one_000.bin" "one_mega:$W/one_mega"; do
  name=${src%%:*}; path=${src#*:}
  timeout 300 "$TPTRAIN" --config cfg.yaml --set "data.path=$path" --set logging.metrics_file="$W/$name.jsonl" \
    > train_$name.log 2>&1 || { bad "train on the $name"; tail -5 train_$name.log; }
done
losses() { $PY -c "import json, sys; print(' '.join(repr(json.loads(l)['lm_loss']) for l in open(sys.argv[1])))" "$1" 2>/dev/null; }
a=$(losses shards.jsonl); b=$(losses megatron.jsonl)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "training on the shards = on the Megatron int32 dataset: lm loss $a" ||
  { bad "losses differ: shards '$a' megatron '$b'"; }
a=$(losses one_shard.jsonl); b=$(losses one_mega.jsonl)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "one shard given by its path: the same losses as its Megatron twin" ||
  bad "single shard: '$a' vs '$b'"
grep -q "llm.c shards.*uint32" train_shards.log && ok "the start-up log names the uint32 shards" ||
  { bad "start-up log"; grep -i "llm.c\|data" train_shards.log | head -3; }

# ---- bad shards: exit 2 naming the problem
$PY "$MAKE" --tokens 100 --llmc "$W/v6_" --version 6 2> /dev/null
$PY "$MAKE" --tokens 100 --llmc "$W/big_" --token-at 7:128256 2> /dev/null
head -c 1500 "$W/one_000.bin" > "$W/cut.bin"
expect_exit2 wrong_version "unsupported llm.c shard version 6 (expected 7" \
  "$TPTRAIN" data --config cfg.yaml --set "data.path=$W/v6_000.bin" --samples 0:1
expect_exit2 token_outside_vocab "token 128256 at position 7 is outside the vocabulary [0, 128256)" \
  "$TPTRAIN" data --config cfg.yaml --set "data.path=$W/big_000.bin" --samples 0:1
expect_exit2 truncated "truncated?" "$TPTRAIN" data --config cfg.yaml --set "data.path=$W/cut.bin" --samples 0:1
expect_exit2 small_vocab "outside the vocabulary [0, 50257)" \
  "$TPTRAIN" --config cfg.yaml --set "data.path=$W/tok_*.bin" --set model.vocab_size=50257 --set data.eod_token_id=50256

finish
