# Sourced by the FP8 training tests (tests/cli/fp8.sh, fp8_moe.sh) after lib.sh: their data and
# config, tptrain and the emulated-FP8 reference on the config $CFG (default $W/cfg.yaml), and the
# comparison of their losses.
source "$TPTRAIN_SRC/tests/cli/ref_lib.sh"  # ref_py: the reference runs forked from one Python

# fp8_setup WHAT [MODEL_KEYS]: ends the test (skipped) without torch / numpy / yaml; else the tokens in
# $W/data and $W/cfg.yaml: GPT, 4 layers of hidden 64, bf16, 20 steps (MODEL_KEYS: ", key: value" more)
fp8_setup() {
  if ! "$PY" -c "import torch, numpy, yaml" 2>/dev/null; then
    echo "SKIPPED: $1: no torch / numpy / yaml for $PY"
    finish
    exit
  fi
  "$PY" "$TPTRAIN_SRC/tests/reference/make_tokens.py" --vocab 97 --tokens 30000 --docs 20 --seed 5 --megatron "$W/data" \
    >/dev/null 2>&1
  cat > "$W/cfg.yaml" <<YAML
model: {num_layers: 4, hidden_size: 64, num_attention_heads: 4, seq_length: 32, vocab_size: 97,
        make_vocab_size_divisible_by: 8${2:-}}
training: {micro_batch_size: 4, global_batch_size: 16, train_iters: 20, cpu_threads: 1, seed: 11, precision: bf16}
optimizer: {lr: 2.0e-3, min_lr: 2.0e-4, lr_warmup_iters: 3, lr_decay_style: cosine, weight_decay: 0.1, clip_grad: 1.0,
            adam_beta1: 0.9, adam_beta2: 0.95, adam_eps: 1.0e-8}
data: {path: $W/data, shuffle: false, split: [100, 0, 0], eval_iters: 0}
logging: {log_interval: 1}
YAML
}
tpt() {  # name np args...: tptrain's metrics in $W/name.jsonl
  local name=$1 np=$2; shift 2
  local launch=()
  [ "$np" -gt 1 ] && launch=(mpirun -np "$np")
  timeout 300 "${launch[@]}" "$TPTRAIN" --config "${CFG:-$W/cfg.yaml}" --set logging.metrics_file="$W/$name.jsonl" "$@" \
    > "$W/$name.log" 2>&1 || { echo "  ($name: tptrain failed)"; tail -5 "$W/$name.log"; return 1; }
}
ref() {  # name args...: the reference's metrics in $W/name.jsonl
  local name=$1; shift
  ref_py "$W/$name.log" "$TPTRAIN_SRC/tests/reference/gpt_ref.py" --config "${CFG:-$W/cfg.yaml}" --out "$W/$name.jsonl" "$@" \
    || { echo "  ($name: the reference failed)"; tail -5 "$W/$name.log"; return 1; }
}
# within A B TOL [FAR BTOL]: max |loss A - loss B| over A's iterations (each in B; at least MIN_STEPS,
# default 1) <= TOL; with FAR, max |loss FAR - loss B| > BTOL
within() {
  "$PY" - "$W/$1.jsonl" "$W/$2.jsonl" "$3" "${4:+$W/$4.jsonl}" "${5:-0}" <<'PYEOF'
import json, os, sys
load = lambda p: {json.loads(l)["iteration"]: json.loads(l)["lm_loss"] for l in open(p)}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) >= int(os.environ.get("MIN_STEPS", 1)) and set(a) <= set(b), (sorted(a), sorted(b))
d = max(abs(a[k] - b[k]) for k in a)
name = lambda p: p.rsplit("/", 1)[-1][:-len(".jsonl")]
msg = f"  max |loss {name(sys.argv[1])} - loss {name(sys.argv[2])}| = {d:.2e} over {len(a)} steps (bound {float(sys.argv[3]):.0e})"
good = d <= float(sys.argv[3])
if sys.argv[4]:
    f = load(sys.argv[4])
    far = max(abs(f[k] - b[k]) for k in b)
    msg += f"; {name(sys.argv[4])}: {far:.2e} (must be > {float(sys.argv[5]):.0e})"
    good = good and far > float(sys.argv[5])
print(msg)
sys.exit(0 if good else 1)
PYEOF
}
