"""Hugging Face LlamaForCausalLM checkpoints for the PyTorch reference (gpt_ref.py --init, greedy.py),
written from transformers' conventions, not from tptrain's code: config.json, model.safetensors or
shards named by model.safetensors.index.json, tensors [out, in]; q_proj rows head by head (head h:
rows h*D..h*D+D-1), k_proj / v_proj the same per KV head, query head h attending with KV head
h // (H / KV) (transformers' repeat_kv); q/k channels in rotate-half order (pairs (j, j + D/2)).

The reference model (model_ref.py) holds Megatron's layout: attn.qkv.weight rows grouped per KV head
(its H/KV query heads, its key, its value) with group_query_attention, else [q; k; v]; mlp.fc1 =
[gate; up]; with rotary_interleaved its RoPE pairs channels (2j, 2j + 1), so q/k rows are permuted
into that order (the inverse of transformers' convert_llama_weights_to_hf permute).
"""
import json
import os

import numpy as np


class HFLlamaError(Exception):
    pass


def _config_path(path):
    if os.path.isdir(path):
        return os.path.join(path, "config.json")
    if os.path.basename(path) == "config.json":
        return path
    return os.path.join(os.path.dirname(path) or ".", "config.json")


def is_hf_llama(path):
    """Whether `path` (a directory, index, config.json or safetensors file) is an HF Llama checkpoint."""
    cfg = _config_path(path)
    if not os.path.isfile(cfg):
        return False
    with open(cfg) as f:
        c = json.load(f)
    arch = c.get("architectures")
    return "LlamaForCausalLM" in arch if arch else c.get("model_type") == "llama"


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise HFLlamaError(f"key {k!r} appears twice")
        seen[k] = v
    return seen


def read_checkpoint(path, read_safetensors):
    """(config dict, {name: float64 array}) of an HF Llama checkpoint; read_safetensors(file) reads one file."""
    cfg_path = _config_path(path)
    with open(cfg_path) as f:
        cfg = json.load(f)
    base = path if os.path.isdir(path) else os.path.dirname(path) or "."
    index = None
    if path.endswith(".index.json"):
        index = path
    elif os.path.isdir(path) or os.path.basename(path) == "config.json":
        if os.path.isfile(os.path.join(base, "model.safetensors.index.json")):
            index = os.path.join(base, "model.safetensors.index.json")
    if index is None:
        single = path if path.endswith(".safetensors") else os.path.join(base, "model.safetensors")
        return cfg, read_safetensors(single)
    with open(index) as f:
        wm = json.load(f, object_pairs_hook=_no_duplicates)["weight_map"]
    tensors = {}
    for shard in sorted(set(wm.values())):
        for name, arr in read_safetensors(os.path.join(base, shard)).items():
            if wm.get(name) != shard:
                raise HFLlamaError(f"{shard} holds {name}, which the index maps to {wm.get(name)}")
            tensors[name] = arr
    missing = sorted(set(wm) - set(tensors))
    if missing:
        raise HFLlamaError(f"tensors named by the index but not in their shards: {missing[:5]}")
    return cfg, tensors


def _rope(cfg):
    """(rope_theta, llama3 scaling dict or None) from rope_theta/rope_scaling or rope_parameters."""
    rp = cfg.get("rope_parameters")
    if rp:
        theta, sc = rp.get("rope_theta", cfg.get("rope_theta", 10000.0)), rp
    else:
        theta, sc = cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling")
    if not sc or sc.get("rope_type", sc.get("type", "default")) == "default":
        return float(theta), None
    assert sc.get("rope_type", sc.get("type")) == "llama3", sc
    return float(theta), {k: sc[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings")}


def model_config(cfg):
    """The reference model config (tptrain's model keys) an HF Llama config.json describes."""
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    theta, scaling = _rope(cfg)
    bias = bool(cfg.get("attention_bias", False))
    if bias != bool(cfg.get("mlp_bias", False)):
        raise HFLlamaError("attention_bias != mlp_bias: the model's add_bias_linear cannot hold it")
    return {"num_layers": cfg["num_hidden_layers"], "hidden_size": cfg["hidden_size"], "num_attention_heads": H,
            "ffn_hidden_size": cfg["intermediate_size"], "vocab_size": cfg["vocab_size"],
            "max_position_embeddings": cfg["max_position_embeddings"], "layernorm_epsilon": cfg["rms_norm_eps"],
            "normalization": "RMSNorm", "swiglu": True, "position_embedding_type": "rope", "rotary_base": theta,
            "rotary_percent": 1.0, "rotary_interleaved": False, "rope_scaling": scaling,
            "group_query_attention": KV != H, "num_query_groups": KV if KV != H else None,
            "kv_channels": cfg.get("head_dim") or cfg["hidden_size"] // H,
            "untie_embeddings_and_output_weights": not cfg.get("tie_word_embeddings", False),
            "add_bias_linear": bias, "add_qkv_bias": False}


def check_model(cfg, m):
    """Raises HFLlamaError when the model config m (tptrain's keys) is not the one config.json describes
    (max_position_embeddings aside: a run may use fewer positions)."""
    want = model_config(cfg)
    get = lambda k, d=None: m.get(k) if m.get(k) is not None else d  # noqa: E731
    have = {"num_layers": m["num_layers"], "hidden_size": m["hidden_size"],
            "num_attention_heads": m["num_attention_heads"], "ffn_hidden_size": m["ffn_hidden_size"],
            "vocab_size": m["vocab_size"], "layernorm_epsilon": m["layernorm_epsilon"],
            "normalization": get("normalization", "LayerNorm"), "swiglu": get("swiglu", False),
            "position_embedding_type": get("position_embedding_type", "learned_absolute"),
            "rotary_base": float(get("rotary_base", 10000.0)), "rotary_percent": get("rotary_percent", 1.0),
            "rope_scaling": get("rope_scaling"),
            "kv_channels": get("kv_channels", m["hidden_size"] // m["num_attention_heads"]),
            "untie_embeddings_and_output_weights": get("untie_embeddings_and_output_weights", False),
            "add_bias_linear": get("add_bias_linear", True), "add_qkv_bias": get("add_qkv_bias", False)}
    kv = m["num_query_groups"] if get("group_query_attention", False) else m["num_attention_heads"]
    if kv != (want["num_query_groups"] or want["num_attention_heads"]):
        raise HFLlamaError(f"num_key_value_heads {want['num_query_groups'] or want['num_attention_heads']} vs {kv}")
    for k, v in have.items():
        w = want[k]
        if k == "rope_scaling" and v is not None:
            v = {x: v[x] for x in w} if w else v
        if v != w:
            raise HFLlamaError(f"config.json gives {k} = {w!r}, the config {v!r}")


def to_state(cfg, tensors, m, check=None, layer_mlp=None):
    """{reference parameter name: float64 array} of the model m (tptrain's keys) from HF tensors.
    check(cfg, m) (default check_model) raises when m is not config.json's model; layer_mlp(i, take, st),
    when given, fills layer i's MLP entries of st (hf_moe_ref.py: MoE layers) and returns True, or
    returns False for the dense mlp.gate_proj / up_proj / down_proj."""
    (check or check_model)(cfg, m)
    L, C, H = m["num_layers"], m["hidden_size"], m["num_attention_heads"]
    D = m.get("kv_channels") or C // H
    gqa = bool(m.get("group_query_attention"))
    KV = m["num_query_groups"] if gqa else H
    F, V = m["ffn_hidden_size"], m["vocab_size"]
    bias = m.get("add_bias_linear", True)
    qkv_bias = bias or bool(m.get("add_qkv_bias", False))
    tied = not m.get("untie_embeddings_and_output_weights", False)
    interleaved = bool(m.get("rotary_interleaved", False))
    used = set()

    def take(name, shape):
        if name not in tensors:
            raise HFLlamaError(f"missing tensor {name}")
        a = tensors[name]
        if list(a.shape) != list(shape):
            raise HFLlamaError(f"{name} has shape {list(a.shape)}, config.json implies {list(shape)}")
        used.add(name)
        return a

    def heads(a, n):          # (n*D, ...) -> (n, D, ...), rotate-half channels -> interleaved when asked
        a = a.reshape(n, D, *a.shape[1:])
        if interleaved:       # ours 2j + e <- HF e * D/2 + j
            a = a.reshape(n, 2, D // 2, *a.shape[2:]).swapaxes(1, 2).reshape(n, D, *a.shape[2:])
        return a

    st = {"wte.weight": take("model.embed_tokens.weight", [V, C])}
    for i in range(L):
        h, o = f"model.layers.{i}.", f"h.{i}."
        st[o + "ln_1.weight"] = take(h + "input_layernorm.weight", [C])
        st[o + "ln_2.weight"] = take(h + "post_attention_layernorm.weight", [C])
        for kind in ("weight", "bias") if qkv_bias else ("weight",):
            tail = [C] if kind == "weight" else []
            q = heads(take(h + f"self_attn.q_proj.{kind}", [H * D] + tail), H)
            k = heads(take(h + f"self_attn.k_proj.{kind}", [KV * D] + tail), KV)
            v = take(h + f"self_attn.v_proj.{kind}", [KV * D] + tail).reshape(KV, D, *tail)
            if gqa:               # per KV head g: query heads g*H/KV .. , then k_g, then v_g
                qg = q.reshape(KV, H // KV, D, *tail)
                qkv = np.concatenate([qg, k[:, None], v[:, None]], axis=1)
            else:
                qkv = np.concatenate([q, k, v], axis=0)
            st[o + f"attn.qkv.{kind}"] = qkv.reshape((H + 2 * KV) * D, *tail)
        dense = not (layer_mlp and layer_mlp(i, take, st))
        for kind in ("weight", "bias") if bias else ("weight",):
            tail = [C] if kind == "weight" else []
            st[o + f"attn.proj.{kind}"] = take(h + f"self_attn.o_proj.{kind}", [C, H * D] if tail else [C])
            if dense:
                st[o + f"mlp.fc1.{kind}"] = np.concatenate([take(h + f"mlp.gate_proj.{kind}", [F] + tail),
                                                            take(h + f"mlp.up_proj.{kind}", [F] + tail)], axis=0)
                st[o + f"mlp.fc2.{kind}"] = take(h + f"mlp.down_proj.{kind}", [C, F] if tail else [C])
        used.update(n for n in tensors if n.startswith(h) and n.endswith("rotary_emb.inv_freq"))
    st["ln_f.weight"] = take("model.norm.weight", [C])
    if not tied:
        st["lm_head.weight"] = take("lm_head.weight", [V, C])
    elif "lm_head.weight" in tensors:
        used.add("lm_head.weight")
    extra = sorted(set(tensors) - used)
    if extra:
        raise HFLlamaError(f"unexpected tensors {extra[:5]}")
    return st
