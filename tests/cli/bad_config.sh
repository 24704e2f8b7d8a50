#!/usr/bin/env bash
# Bad configs and arguments: tptrain must exit with status 2 (bad input), quickly, and name the key or
# file at fault on stderr. Each fixture in bad_configs/ is a valid tiny config but for one fault.
# Env: TPTRAIN (binary), TPTRAIN_SRC (source dir), TPTRAIN_WORK (scratch dir).
set -u

: "${TPTRAIN:?set TPTRAIN to the tptrain binary}"
: "${TPTRAIN_SRC:?set TPTRAIN_SRC to the source directory}"
: "${TPTRAIN_WORK:?set TPTRAIN_WORK to a scratch directory}"
case "$TPTRAIN" in */*) TPTRAIN="$(cd "$(dirname "$TPTRAIN")" && pwd)/$(basename "$TPTRAIN")" ;; esac
FIX="$(cd "$TPTRAIN_SRC" && pwd)/tests/cli/bad_configs"
source "$TPTRAIN_SRC/tests/cli/lib.sh"
cd "$W" || exit 1

# check NAME EXPECTED -- ARGS...: runs tptrain ARGS; EXPECTED holds the substrings, separated by
# '|', that stderr must contain.
check() {
  local name="$1" expected="$2"
  shift 3
  local out="$TPTRAIN_WORK/$name.out" err="$TPTRAIN_WORK/$name.err"
  timeout 20 "$TPTRAIN" "$@" >"$out" 2>"$err"
  local rc=$?
  local why=""
  if [ "$rc" -eq 124 ]; then
    why="timed out after 20 s"
  elif [ "$rc" -gt 128 ]; then
    why="killed by signal $((rc - 128)) (crash)"
  elif [ "$rc" -ne 2 ]; then
    why="exit status $rc, expected 2"
  else
    local sub
    IFS='|' read -r -a subs <<<"$expected"
    for sub in "${subs[@]}"; do
      if ! grep -qF -- "$sub" "$err"; then
        why="stderr lacks '$sub'"
        break
      fi
    done
  fi
  if [ -z "$why" ]; then
    ok "$name: $(head -n 1 "$err" | cut -c1-300)"
  else
    bad "$name: $why; stderr:"
    sed 's/^/    /' "$err" | head -n 20
  fi
}

fixture() { echo "$FIX/$1.yaml"; }
BASE="$(fixture base_valid)"

check unknown_key "logging.foo_bar: unknown key" -- --config "$(fixture unknown_key)"
check misspelt_key "model.hidden_sise|did you mean 'model.hidden_size'" -- --config "$(fixture misspelt_key)"
check misspelt_section "optimiser: unknown section|did you mean 'optimizer'" -- --config "$(fixture misspelt_section)"
check wrong_type_string "model.hidden_size|expected an integer|sixty-four" -- --config "$(fixture wrong_type_string)"
check wrong_type_float "model.num_layers|expected an integer|2.5" -- --config "$(fixture wrong_type_float)"
check wrong_type_map "optimizer.lr|expected a number|a map" -- --config "$(fixture wrong_type_map)"
check wrong_type_bool "parallel.sequence_parallel|maybe" -- --config "$(fixture wrong_type_bool)"
check negative_size "model.num_layers|must be >= 1" -- --config "$(fixture negative_size)"
check heads_not_dividing_hidden "model.hidden_size|model.num_attention_heads" -- --config "$(fixture heads_not_dividing_hidden)"
check global_batch_not_multiple "training.global_batch_size|training.micro_batch_size" -- --config "$(fixture global_batch_not_multiple)"
check seq_longer_than_positions "model.seq_length|model.max_position_embeddings" -- --config "$(fixture seq_longer_than_positions)"
check unknown_enum "training.precision|fp8|fp32 | bf16 | fp16" -- --config "$(fixture unknown_enum)"
check missing_init_from "model.init_from|gpt2_missing.safetensors" -- --config "$(fixture missing_init_from)"
check missing_required "model.vocab_size|missing required key" -- --config "$(fixture missing_required)"
check dropout_out_of_range "model.hidden_dropout|[0, 1)" -- --config "$(fixture dropout_out_of_range)"
check min_lr_above_lr "optimizer.min_lr|optimizer.lr" -- --config "$(fixture min_lr_above_lr)"
check bad_split "data.split" -- --config "$(fixture bad_split)"
check top_level_list "top_level_list.yaml|map of sections" -- --config "$(fixture top_level_list)"
check yaml_syntax_error "yaml_syntax_error.yaml:|YAML syntax error" -- --config "$(fixture yaml_syntax_error)"
check empty_file "empty.yaml|empty" -- --config "$(fixture empty)"
check absent_file "does_not_exist.yaml|cannot read" -- --config "$TPTRAIN_WORK/does_not_exist.yaml"
check directory_as_config "bad_configs|is a directory" -- --config "$FIX"
check set_unknown_key "model.hiden_size|did you mean 'model.hidden_size'" -- --config "$BASE" --set model.hiden_size=64
check set_no_equals "--set model.hidden_size|section.key=value" -- --config "$BASE" --set model.hidden_size
check set_no_section "hidden_size=64|section.key=value" -- --config "$BASE" --set hidden_size=64
# 30,000-character values (issue 17: a recursive std::regex crashed on them with SIGSEGV)
LONG=$(printf 'x%.0s' $(seq 30000))
check set_long_path "/nonexistent/xxxxxxxxxx|not found" -- --config "$BASE" --set data.path="/nonexistent/$LONG"
DIGITS=$(printf '9%.0s' $(seq 30000))
check set_long_number "training.train_iters" -- --config "$BASE" --set training.train_iters="$DIGITS"
check set_long_float "optimizer.lr" -- --config "$BASE" --set optimizer.lr="0.$DIGITS"e999
# counts beyond any real run, and configs too large to plan or to fit (issue 17 items 3-5): exit 2
# naming the key and the bound or the plan's numbers, at once (no overflow, no bad_alloc, no hang)
check cpu_threads_bound "training.cpu_threads: must be <= 4096" -- --config "$BASE" --set training.cpu_threads=10000000
check hidden_size_bound "model.hidden_size: must be <= 1048576" -- plan --config "$BASE" --set model.hidden_size=536870912
check num_layers_bound "model.num_layers: must be <= 100000" -- plan --config "$BASE" --set model.num_layers=10000000
check pp_bound "parallel.pipeline_model_parallel_size: must be <= 1024" -- plan --config "$BASE" \
  --set parallel.pipeline_model_parallel_size=100000 --set model.num_layers=100000
check plan_beyond_a_pib "TiB per rank|more than a PiB" -- plan --config "$BASE" --set model.num_layers=100000 \
  --set model.hidden_size=65536 --set model.num_attention_heads=64
check schedule_too_long "training.global_batch_size|scheduled passes, more than 1048576" -- plan --config "$BASE" \
  --set training.global_batch_size=1000000000 --set training.micro_batch_size=4
# only regular files, one YAML document (issue 17 items 4, 6, 8)
printf 'model: {num_layers: 2}\n---\nmodel: {num_layers: 3}\n' > "$TPTRAIN_WORK/multi.yaml"
check multi_document "multi.yaml|more than one YAML document" -- --config "$TPTRAIN_WORK/multi.yaml"
rm -f "$TPTRAIN_WORK/fifo.yaml"; mkfifo "$TPTRAIN_WORK/fifo.yaml"
check fifo_config "fifo.yaml|not a regular file" -- --config "$TPTRAIN_WORK/fifo.yaml"
check dev_zero_config "/dev/zero|not a regular file" -- --config /dev/zero
check non_utf8_string "data.path|not valid UTF-8" -- --config "$BASE" --set data.path="$(printf 'ab\xff\xfe')"
check train_beyond_memory "by the plan, but has|MiB of host memory per rank" -- --config "$BASE" \
  --set model.hidden_size=65536 --set model.num_attention_heads=64
check set_wrong_type "training.train_iters|expected an integer|ten" -- --config "$BASE" --set training.train_iters=ten
check set_bad_yaml "data.split|YAML syntax error" -- --config "$BASE" --set "data.split=[98,1"
check set_constraint "parallel.tensor_model_parallel_size|must be >= 1" -- --config "$BASE" --set parallel.tensor_model_parallel_size=0
check sequence_parallel_tp1 "parallel.sequence_parallel|parallel.tensor_model_parallel_size > 1" -- --config "$BASE" \
  --set parallel.sequence_parallel=true
check overlap_param_gather_without_distopt "parallel.overlap_param_gather|parallel.distributed_optimizer" -- \
  --config "$BASE" --set parallel.overlap_param_gather=true
# the LLaMA-family model keys (issue 26): each rule names its key(s)
LLAMA="$(fixture llama_valid)"
check llama_gqa_without_groups "model.group_query_attention|model.num_query_groups" -- \
  --config "$(fixture llama_gqa_without_groups)"
check llama_heads_not_dividing_groups "model.num_attention_heads: 4 is not divisible by model.num_query_groups (3)" -- \
  --config "$(fixture llama_heads_not_dividing_groups)"
check llama_swiglu_without_ffn "model.swiglu|give model.ffn_hidden_size explicitly" -- \
  --config "$(fixture llama_swiglu_without_ffn)"
check llama_rotary_odd_dim "model.rotary_percent|model.kv_channels (16)|not an even integer" -- \
  --config "$(fixture llama_rotary_odd_dim)"
check llama_rotary_without_rope "model.rotary_base|only used with position_embedding_type: rope|model.position_embedding_type" -- \
  --config "$(fixture llama_rotary_without_rope)"
check llama_rope_scaling_misspelt "model.rope_scaling.facter: unknown key|did you mean 'model.rope_scaling.factor'" -- \
  --config "$(fixture llama_rope_scaling_misspelt)"
check llama_groups_without_gqa "model.num_query_groups|model.group_query_attention: true" -- \
  --config "$BASE" --set model.num_query_groups=2
check llama_rope_type "model.rope_scaling.rope_type|only 'llama3'" -- --config "$LLAMA" \
  --set "model.rope_scaling={factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192, rope_type: linear}"
check llama_rope_scaling_factors "model.rope_scaling.high_freq_factor|model.rope_scaling.low_freq_factor" -- --config "$LLAMA" \
  --set "model.rope_scaling={factor: 8, low_freq_factor: 4, high_freq_factor: 1, original_max_position_embeddings: 8192}"
check llama_groups_not_dividing_tp "model.num_query_groups (2)|parallel.tensor_model_parallel_size (4)" -- \
  plan --config "$LLAMA" --world-size 4 --set parallel.tensor_model_parallel_size=4
# experts split over TP (ETP = TP, the default with TP > 1): their width must divide by TP
check moe_width_not_dividing_etp "model.moe_ffn_hidden_size: 33|parallel.expert_tensor_parallel_size (2" -- \
  plan --config "$BASE" --world-size 2 --set parallel.tensor_model_parallel_size=2 --set parallel.sequence_parallel=true \
  --set model.num_moe_experts=4 --set model.moe_ffn_hidden_size=33
# training.recompute_modules: core_attn must be listed, Megatron's other modules are named as not built,
# moe_act needs an MoE model, mlp a dense layer, shared_experts a shared expert
MOE4=(--set model.num_moe_experts=4 --set model.moe_ffn_hidden_size=32)
check recompute_modules_without_core_attn "training.recompute_modules: must list core_attn" -- plan --config "$BASE" \
  "${MOE4[@]}" --set training.recompute=selective --set "training.recompute_modules=[moe_act]"
check recompute_modules_mla "training.recompute_modules: Megatron's module 'mla_up_proj' is not built" -- \
  plan --config "$BASE" --set training.recompute=selective --set "training.recompute_modules=[core_attn, mla_up_proj]"
check recompute_modules_no_shared_expert "training.recompute_modules|model.moe_shared_expert_intermediate_size|has none" -- \
  plan --config "$BASE" "${MOE4[@]}" --set training.recompute=selective --set "training.recompute_modules=[core_attn, shared_experts]"
check recompute_modules_mlp_all_moe "training.recompute_modules|model.moe_layer_freq|every layer is an MoE layer" -- \
  plan --config "$BASE" "${MOE4[@]}" --set training.recompute=selective --set "training.recompute_modules=[core_attn, mlp]"
check recompute_modules_unknown "unknown module 'moe_ac'|core_attn | moe_act | layernorm | moe | mlp | shared_experts" -- plan --config "$BASE" \
  --set training.recompute=selective --set "training.recompute_modules=[core_attn, moe_ac]"
check recompute_modules_dense "training.recompute_modules|the model has none" -- plan --config "$BASE" \
  --set training.recompute=selective --set "training.recompute_modules=[core_attn, moe_act]"
check unknown_argument "--bogus-flag" -- --config "$BASE" --bogus-flag
check train_unknown_argument "--bogus-flag" -- train --bogus-flag --config "$BASE"
check no_config "--config" --

finish
