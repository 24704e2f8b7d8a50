#!/usr/bin/python3
"""A Hugging Face export against the checkpoint it came from: every tensor's dtype, shape and bytes
equal (rotary_emb.inv_freq buffers of the input aside), each shard's metadata format "pt", the
index's total_size, and config.json's architecture keys (--keys: more).

  hf_roundtrip.py INPUT_DIR EXPORTED_DIR [--keys k1,k2,...]
"""
import json, os, struct, sys
def tensors(d):
    files = [os.path.join(d, "model.safetensors")]
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        wm = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
        files = [os.path.join(d, f) for f in sorted(set(wm.values()))]
    out = {}
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            h = json.loads(fh.read(n))
            data = fh.read()
        assert h.pop("__metadata__", {}).get("format") == "pt", f
        for k, v in h.items():
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], data[b:e])
    if len(files) > 1:
        total = json.load(open(os.path.join(d, "model.safetensors.index.json")))["metadata"]["total_size"]
        assert total == sum(len(v[2]) for v in out.values()), f"{d}: index total_size {total}"
    return out, len(files)
def rope(c):
    p = c.get("rope_parameters") or {}
    s = p if p else (c.get("rope_scaling") or {})
    s = {k: v for k, v in s.items() if k not in ("rope_type", "type", "rope_theta")} if s.get("rope_type", "default") != "default" else None
    return p.get("rope_theta", c.get("rope_theta")), s
args = [x for x in sys.argv[1:] if x != "--keys"]
extra = []
if "--keys" in sys.argv:
    extra = sys.argv[sys.argv.index("--keys") + 1].split(",")
    args.remove(sys.argv[sys.argv.index("--keys") + 1])
a, na = tensors(args[0])
b, nb = tensors(args[1])
a = {k: v for k, v in a.items() if not k.endswith("rotary_emb.inv_freq")}
assert set(a) == set(b), f"names differ: {sorted(set(a) ^ set(b))}"
for k in a:
    assert a[k][:2] == b[k][:2], f"{k}: dtype/shape {a[k][:2]} -> {b[k][:2]}"
    assert a[k][2] == b[k][2], f"{k}: bytes differ"
ca, cb = (json.load(open(os.path.join(d, "config.json"))) for d in args[:2])
keys = ["architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings",
        "attention_bias", "mlp_bias", "hidden_act", "max_position_embeddings", "torch_dtype"] + extra
for k in keys:
    assert ca.get(k) == cb.get(k), f"config.json {k}: {ca.get(k)!r} -> {cb.get(k)!r}"
assert rope(ca) == rope(cb), f"rope: {rope(ca)} -> {rope(cb)}"
dt = sorted({v[0] for v in b.values()})
print(f"{len(b)} tensors ({'/'.join(dt)}) byte for byte, {nb} file(s) (input {na}), config.json's {len(keys) + 2} keys equal")
