#!/usr/bin/env bash
# logging.profile_ops (README "Logging"): a TP 2 x PP 2 bf16 run on 4 CPU ranks prints rank 0's op
# table (every GEMM by layer part and direction, attention, LayerNorm, cross-entropy on the last
# stage only, the optimizer, the TP and PP collectives), with calls per iteration that follow from
# the config; the spans go to the trace on a track of their own (the schedule tools still read it);
# and profiling changes no loss (bitwise equal to the same run without it).
set -uo pipefail
source "$TPTRAIN_SRC/tests/cli/lib.sh"
$PYTHON "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 30000 --docs 20 --seed 5 --megatron "$W/data" >/dev/null 2>&1
# 4 layers on 2 stages (2 per stage), 2 micro-batches of 2 per iteration
cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: 97,
        make_vocab_size_divisible_by: 8}
parallel: {tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2}
training: {micro_batch_size: 2, global_batch_size: 4, train_iters: 6, cpu_threads: 1, seed: 3, precision: bf16}
data: {path: $W/data, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
run() {  # name extra-set...
  local name=$1; shift
  timeout 300 mpirun -np 4 "$TPTRAIN" --config "$W/cfg.yaml" --set logging.metrics_file="$W/$name.jsonl" "$@" \
    > "$W/$name.log" 2>&1 || { echo "  ($name: tptrain failed)"; tail -5 "$W/$name.log"; return 1; }
}
run plain && run profiled --set logging.profile_ops=true --set logging.trace_file="$W/trace.json" || { echo "0 passed, 1 failed"; exit 1; }

if $PYTHON - "$W/profiled.log" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if "op profile of rank 0" in l)
assert "over 5 iterations" in lines[start], lines[start]
rows = {}
for l in lines[start + 2:]:
    m = re.match(r"^\s+(\S.*?)\s{2,}([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)%", l)
    if not m:
        break
    rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
print("  rows:", ", ".join(sorted(rows)))
# stage 0 holds 2 layers; 2 micro-batches per iteration
for name in ["linear fwd attn.qkv", "linear fwd attn.proj", "linear fwd mlp.fc1 +GELU", "linear fwd mlp.fc2",
             "linear bwd attn.qkv", "linear bwd mlp.fc2 +dGELU", "attention fwd", "attention bwd",
             "residual + layernorm fwd"]:
    assert rows[name][0] == 4.0, (name, rows.get(name))
assert rows["embedding fwd"][0] == 2.0 and rows["layernorm fwd"][0] == 4.0, rows
# the tied-embedding LM head and the cross-entropy live on the last stage, not rank 0's
assert not any(n.startswith("cross-entropy") or "lm_head" in n for n in rows), rows
# 16-bit TP sums: all-gathers (2 per layer forward + the embedding's; 2 per layer backward)
assert rows["tp all_gather"][0] == 2 * (2 * 2 + 1 + 2 * 2), rows["tp all_gather"]
assert rows["pp send/recv (with waiting)"][0] >= 2, rows
assert "adamw" in rows and "gradient norm" in rows, rows
assert all(ms >= 0 for _, ms in rows.values())
PY
then ok "op table: every op and collective of stage 0 with its calls per iteration"; else bad "op table"; grep -A40 "op profile" "$W/profiled.log"; fi

if $PYTHON - "$W/plain.jsonl" "$W/profiled.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["lm_loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["lm_loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 6 and a == b, (a, b)
PY
then ok "losses bitwise equal with and without the profile"; else bad "losses changed by profiling"; fi

if $PYTHON - "$W/trace.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
ops = [e for e in ev if e.get("cat") == "op"]
sched = [e for e in ev if e.get("cat") in ("forward", "backward")]
assert ops and sched, (len(ops), len(sched))
assert all(e["tid"] == 1 for e in ops) and all(e["tid"] == 0 for e in sched)
assert {e["pid"] for e in ops} == {0, 1, 2, 3}, {e["pid"] for e in ops}
assert any(e["name"] == "cross-entropy loss + dlogits" for e in ops if e["pid"] in (2, 3))
PY
then ok "trace: op spans of every rank on their own track"; else bad "trace op spans"; fi
if $PYTHON "$TPTRAIN_SRC/scripts/bubble.py" "$W/trace.json" > "$W/bubble.out" 2>&1; then ok "bubble.py reads a profiled trace"
else bad "bubble.py on a profiled trace"; cat "$W/bubble.out"; fi

finish
