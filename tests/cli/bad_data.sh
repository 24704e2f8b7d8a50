#!/usr/bin/env bash
# Bad data is bad input: exit status 2 and a message naming the file, never a crash
# (docs/ARCHITECTURE.md "Data formats", "Command line and exit status").
# Environment (set by ctest): TPTRAIN, TPTRAIN_SRC, TPTRAIN_WORK, PYTHON.
set -u
: "${TPTRAIN:?}" "${TPTRAIN_SRC:?}" "${TPTRAIN_WORK:?}"
PYTHON=${PYTHON:-/usr/bin/python3}
TOOL="$TPTRAIN_SRC/tests/tools/make_data.py"
source "$TPTRAIN_SRC/tests/cli/lib.sh"
mkdir -p "$W/out" && cd "$W" || exit 1


# expect_exit2 NAME NEEDLE CMD...: CMD exits with status 2 and its stderr contains NEEDLE.
expect_exit2() {
  local name=$1 needle=$2
  shift 2
  "$@" >"$name.out" 2>"$name.err"
  local rc=$?
  if [[ $rc == 2 ]] && grep -qF -- "$needle" "$name.err"; then
    ok "$name"
  else
    bad "$name: exit $rc (want 2), stderr should name '$needle'"
    sed 's/^/    /' "$name.err"
  fi
}

# ---------------------------------------------------------------------------------------------
# 1. tptrain preprocess
printf 'fine\n' >good.txt
printf '{"text": "fine"}\n{"text": not json}\n{"text": "never read"}\n' >broken.jsonl
printf '{"text": "fine"}\n{"content": "wrong key"}\n' >nokey.jsonl
printf '{"text": ["not", "a", "string"]}\n' >notstring.json

expect_exit2 missing_input missing.txt "$TPTRAIN" preprocess --input good.txt missing.txt --output-prefix out/a
expect_exit2 bad_json_line "broken.jsonl:2:" "$TPTRAIN" preprocess --input broken.jsonl --output-prefix out/b
expect_exit2 json_missing_key "nokey.jsonl:2:" "$TPTRAIN" preprocess --input nokey.jsonl --output-prefix out/c
expect_exit2 json_not_string "notstring.json:1:" "$TPTRAIN" preprocess --input notstring.json --output-prefix out/d
expect_exit2 output_dir_missing "no/such/dir/x.bin" "$TPTRAIN" preprocess --input good.txt --output-prefix no/such/dir/x
expect_exit2 no_output_prefix "--output-prefix" "$TPTRAIN" preprocess --input good.txt
expect_exit2 no_input "--input" "$TPTRAIN" preprocess --output-prefix out/e
expect_exit2 unknown_argument "--tokenizer-typo" "$TPTRAIN" preprocess --input good.txt --output-prefix out/f --tokenizer-typo x
# A failed run leaves no outputs and no temporary files.
left=$(find out -type f | wc -l)
if [[ "$left" == 0 ]]; then ok "failed runs leave nothing behind"; else bad "left behind: $(find out -type f)"; fi

# ---------------------------------------------------------------------------------------------
# 2. Corrupt datasets fed to training.
#    >>> TRAINER SECTION (extend here): each corrupt fixture must give exit 2 with a message naming
#    >>> the broken file, and the *_ok ones must train one iteration. The fixtures are generated and
#    >>> verified by tests/tools/make_data.py. On by default (the trainer reads data);
#    >>> TRAINER_READS_DATA=0 skips this section.
if ! "$PYTHON" "$TOOL" fixtures fixtures >fixtures.log 2>&1; then
  bad "fixture generation"
  sed 's/^/    /' fixtures.log
else
  ok "fixture generation: $(tail -1 fixtures.log)"
fi

# A tiny CPU config that reads DATA_PATH (vocab 64 > every fixture token; seq_length 8).
write_config() {
  cat >"$1" <<EOF
model:
  num_layers: 1
  hidden_size: 16
  num_attention_heads: 2
  seq_length: 8
  vocab_size: 64
parallel:
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
training:
  micro_batch_size: 1
  global_batch_size: 1
  train_iters: 1
  precision: fp32
  device: cpu
data:
  path: $2
  shuffle: false
  split: [1, 0, 0]
EOF
}

if [[ "${TRAINER_READS_DATA:-1}" == 1 ]]; then
  #                 name                      data path                                file the message must name
  for row in "megatron_truncated_bin    fixtures/megatron_truncated_bin     fixtures/megatron_truncated_bin.bin" \
    "megatron_wrong_magic      fixtures/megatron_wrong_magic       fixtures/megatron_wrong_magic.idx" \
    "megatron_pointer_past_end fixtures/megatron_pointer_past_end  fixtures/megatron_pointer_past_end.bin" \
    "megatron_truncated_idx    fixtures/megatron_truncated_idx     fixtures/megatron_truncated_idx.idx" \
    "megatron_missing          fixtures/megatron_nonexistent       fixtures/megatron_nonexistent.idx" \
    "llmc_count_too_large      fixtures/llmc_count_too_large.bin   fixtures/llmc_count_too_large.bin" \
    "llmc_wrong_magic          fixtures/llmc_wrong_magic.bin       fixtures/llmc_wrong_magic.bin" \
    "llmc_glob_no_match        fixtures/nothing_*.bin              fixtures/nothing_*.bin" \
    "vocab_too_small_for_data  fixtures/megatron_ok                vocabulary"; do
    read -r name path needle <<<"$row"
    write_config "$name.yaml" "$path"
    [[ $name == vocab_too_small_for_data ]] && sed -i 's/vocab_size: 64/vocab_size: 32/' "$name.yaml"
    expect_exit2 "train_$name" "$needle" "$TPTRAIN" --config "$name.yaml"
  done
  for ok in megatron_ok llmc_ok.bin; do
    write_config "train_$ok.yaml" "fixtures/$ok"
    if "$TPTRAIN" --config "train_$ok.yaml" >"train_$ok.log" 2>&1; then ok "train_$ok"; else
      bad "train_$ok (exit $?)"
      sed 's/^/    /' "train_$ok.log"
    fi
  done
else
  echo "SKIP: training on corrupt data (TRAINER_READS_DATA=0)"
fi

finish
