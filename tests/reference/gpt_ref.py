#!/usr/bin/python3
"""Independent PyTorch reference for tptrain (docs/ARCHITECTURE.md "Model", "Numerics", "Config", "Data formats").

A deliberately plain GPT-2 (torch.nn, fp32 on CPU, optional float64) with the LLaMA family's
options (RMSNorm, SwiGLU, RoPE, grouped-query attention, untied output layer, no linear biases),
trained exactly the way tptrain must train it, from HF GPT-2 weights or from tptrain's own
counter-based init (init_ref.py), so that tptrain's metrics can be compared step by step:

  gpt_ref.py --config CFG.yaml [--init HF.safetensors | HF_LLAMA_DIR] --steps N --out metrics.jsonl [--set sec.key=v ...]
  gpt_ref.py --bench --layers 12 --hidden 768 --heads 12 --vocab 50257 --seq 64 --micro-batch 4 \
             --threads 2 --iters 5

Everything here is written from the contracts, not from tptrain's code: its own YAML schema, its own
safetensors reader, its own Megatron .idx/.bin and llm.c shard readers.
"""
import argparse
import difflib
import glob
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import yaml

# The model (model_ref.py, next to this file); gpt_ref.build_model stays the name other scripts use.
import hf_llama_ref  # HF Llama checkpoints (tests/reference/hf_llama_ref.py)
import hf_moe_ref  # HF Mixtral / Qwen2-MoE / Qwen3-MoE checkpoints (tests/reference/hf_moe_ref.py)
import fp8_train_ref  # FP8 training's GEMMs, emulated (tests/reference/fp8_train_ref.py, docs/FP8.md)
import moe_ref  # Mixture-of-Experts keys and bookkeeping (tests/reference/moe_ref.py, docs/MOE.md)
from model_ref import GPT, build_model, is_decayed, is_gpt2, tptrain_init_state


class RefError(Exception):
    """A user-facing error (bad config, data or weights): printed without a traceback, exit 2."""


# ----------------------------------------------------------------------------------------------
# Config: the keys of docs/ARCHITECTURE.md "Config". Only what changes the math is honoured; keys that
# cannot change the math on one CPU process (parallel layout, seed when init_from is given, eval,
# checkpoint saving, logging files) are accepted and ignored; anything the reference cannot
# reproduce is an error.

REQUIRED = object()   # must be in the YAML
EXPLICIT = object()   # changes the math and DESIGN states no default: must be given (or --allow-defaults)

# section -> key -> (kind, default, default used by --allow-defaults (core/config.h), nullable)
SCHEMA = {
    "model": {
        "num_layers": ("int", REQUIRED, None, False),
        "hidden_size": ("int", REQUIRED, None, False),
        "num_attention_heads": ("int", REQUIRED, None, False),
        "ffn_hidden_size": ("int", None, None, True),            # DESIGN: default 4 * hidden_size
        "seq_length": ("int", REQUIRED, None, False),
        "max_position_embeddings": ("int", None, None, True),    # DESIGN: default seq_length
        "vocab_size": ("int", REQUIRED, None, False),
        "make_vocab_size_divisible_by": ("int", 128, None, False),  # padding never changes the math
        "layernorm_epsilon": ("float", 1.0e-5, None, False),     # DESIGN Model: default 1e-5
        # the LLaMA family (DESIGN "Model"; Megatron's names; the defaults are GPT-2)
        "normalization": ("str", "LayerNorm", None, False),      # LayerNorm | RMSNorm
        "swiglu": ("bool", False, None, False),
        "position_embedding_type": ("str", "learned_absolute", None, False),  # | rope
        "rotary_base": ("float", 10000.0, None, False),
        "rotary_percent": ("float", 1.0, None, False),
        "rotary_interleaved": ("bool", False, None, False),
        "rope_scaling": ("rope_scaling", None, None, True),
        "group_query_attention": ("bool", False, None, False),
        "num_query_groups": ("int", None, None, True),
        "kv_channels": ("int", None, None, True),                # default hidden_size / heads
        "untie_embeddings_and_output_weights": ("bool", False, None, False),
        "add_bias_linear": ("bool", True, None, False),
        "add_qkv_bias": ("bool", False, None, False),
        "qk_layernorm": ("bool", False, None, False),
        "init_method_std": ("float", 0.02, None, False),         # tptrain's Philox init (init_ref.py)
        "hidden_dropout": ("float", 0.0, None, False),
        "attention_dropout": ("float", 0.0, None, False),
        "init_from": ("str", None, None, True),
    },
    "parallel": {
        "tensor_model_parallel_size": ("int", 1, None, False),
        "pipeline_model_parallel_size": ("int", 1, None, False),
        "virtual_pipeline_model_parallel_size": ("int", None, None, True),  # interleaved chunks: no math
        "data_parallel_size": ("int", None, None, True),
        "pipeline_schedule": ("str", "1f1b", None, False),
        "sequence_parallel": ("bool", False, None, False),
        "context_parallel_size": ("int", 1, None, False),         # where the tokens' attention runs: no math
        "distributed_optimizer": ("bool", False, None, False),    # where the sums and updates run: no math
        "overlap_param_gather": ("bool", False, None, False),
        "overlap_grad_reduce": ("bool", False, None, False),      # when the DP sums run: no math
        "ddp_bucket_size": ("int", 40000000, None, False),
        # the bf16 gradient buffer (as optimizer.main_grads_dtype: bf16): train_step's bf16_grads
        "grad_reduce_in_bf16": ("bool", False, None, False),
    },
    "training": {
        "micro_batch_size": ("int", EXPLICIT, 1, False),
        "global_batch_size": ("int", EXPLICIT, None, True),
        "train_iters": ("int", REQUIRED, None, False),
        "precision": ("str", EXPLICIT, "fp32", False),
        "recompute": ("str", "none", None, False),
        # what selective recompute reruns: memory only, nothing the reference computes differently
        "recompute_modules": ("modules", ["core_attn"], None, False),
        "seed": ("int", 1234, None, False),
        "device": ("str", "auto", None, False),
        "cpu_threads": ("int", None, None, True),
        # FP8 (docs/FP8.md; tests/reference/fp8_train_ref.py emulates the GEMM path)
        "fp8_format": ("str", None, None, True),                  # null | e4m3 | hybrid
        "fp8_recipe": ("str", "delayed", None, False),
        "fp8_margin": ("int", 0, None, False),
        "fp8_amax_history_len": ("int", 1, None, False),
        "fp8_amax_compute_algo": ("str", "most_recent", None, False),
        "fp8_wgrad": ("bool", True, None, False),
        "first_last_layers_bf16": ("bool", False, None, False),
        "num_layers_at_start_in_bf16": ("int", 1, None, False),
        "num_layers_at_end_in_bf16": ("int", 1, None, False),
    },
    "optimizer": {
        "lr": ("float", EXPLICIT, 6.0e-4, False),
        "min_lr": ("float", EXPLICIT, 0.0, False),
        "lr_warmup_iters": ("int", EXPLICIT, 0, False),
        "lr_decay_style": ("str", EXPLICIT, "cosine", False),
        "lr_decay_iters": ("int", None, None, True),              # DESIGN: default train_iters
        "weight_decay": ("float", EXPLICIT, 0.1, False),
        "adam_beta1": ("float", EXPLICIT, 0.9, False),
        "adam_beta2": ("float", EXPLICIT, 0.95, False),
        "adam_eps": ("float", EXPLICIT, 1.0e-8, False),
        "clip_grad": ("float", EXPLICIT, 1.0, False),
        "initial_loss_scale": ("float", 4294967296.0, None, False),
        "store_param_remainders": ("bool", False, False, False),  # storage only: the same numerics
        # the precision-aware optimizer (Megatron's names): the moments kept in bf16 between steps
        "use_precision_aware_optimizer": ("bool", False, False, False),
        "exp_avg_dtype": ("str", "fp32", None, False),
        "exp_avg_sq_dtype": ("str", "fp32", None, False),
        "main_grads_dtype": ("str", "fp32", None, False),
        "main_params_dtype": ("str", "fp32", None, False),
    },
    "data": {
        "path": ("str", REQUIRED, None, False),
        "shuffle": ("bool", EXPLICIT, True, False),
        "split": ("split", EXPLICIT, [969.0, 30.0, 1.0], False),
        "valid_path": ("str", None, None, True),
        "eod_mask_loss": ("bool", False, False, False),
        "reset_position_ids": ("bool", False, False, False),
        "eod_token_id": ("int", None, None, True),             # null: vocab_size - 1
        "eval_interval": ("int", 1000, None, False),
        "eval_iters": ("int", 10, None, False),
    },
    "checkpoint": {
        "save": ("str", None, None, True),
        "save_interval": ("int", 1000, None, False),
        "load": ("str", None, None, True),
        "keep_last": ("int", None, None, True),
        "exit_signal": ("str", "SIGTERM", None, False),
        "exit_duration_mins": ("float", None, None, True),
    },
    "logging": {
        "log_interval": ("int", 1, None, False),
        "metrics_file": ("str", None, None, True),
        "trace_file": ("str", None, None, True),
    },
}
SCHEMA["model"].update(moe_ref.MODEL_KEYS)        # docs/MOE.md "Config"
SCHEMA["parallel"].update(moe_ref.PARALLEL_KEYS)  # the expert layout: accepted, no math here


def _closest(word, choices):
    m = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{m[0]}'?)" if m else ""


def _convert(where, kind, nullable, value):
    if value is None:
        if nullable:
            return None
        raise RefError(f"config key {where}: null is not allowed")
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise RefError(f"config key {where}: expected an integer, got {value!r}")
        return value
    if kind == "float":
        if isinstance(value, bool):
            raise RefError(f"config key {where}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads 1e-3 as a string; YAML 1.2 does not
            try:
                return float(value)
            except ValueError:
                pass
        raise RefError(f"config key {where}: expected a number, got {value!r}")
    if kind == "bool":
        if not isinstance(value, bool):
            raise RefError(f"config key {where}: expected true/false, got {value!r}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise RefError(f"config key {where}: expected a string, got {value!r}")
        return value
    if kind == "rope_scaling":  # Llama 3.1's {factor, low_freq_factor, high_freq_factor, original_max_...}
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        if not isinstance(value, dict) or set(value) - {"rope_type"} != set(keys) or \
                value.get("rope_type", "llama3") != "llama3":
            raise RefError(f"config key {where}: expected null or a mapping with exactly the keys "
                           f"{', '.join(keys)} (and optionally rope_type: llama3), got {value!r}")
        out = {k: _convert(f"{where}.{k}", "float", False, value[k]) for k in keys[:3]}
        out[keys[3]] = _convert(f"{where}.{keys[3]}", "int", False, value[keys[3]])
        if not (out["factor"] > 0 and out[keys[3]] > 0 and 0 < out["low_freq_factor"] < out["high_freq_factor"]):
            raise RefError(f"config key {where}: needs factor > 0, original_max_position_embeddings > 0 "
                           f"and 0 < low_freq_factor < high_freq_factor, got {value!r}")
        return out
    if kind == "split":
        if isinstance(value, str):  # Megatron's spelling "949,50,1"
            value = [v.strip() for v in value.split(",")]
        if not isinstance(value, list) or not 1 <= len(value) <= 3:
            raise RefError(f"config key {where}: expected a list of 1 to 3 weights, got {value!r}")
        out = [_convert(where, "float", False, v) for v in value]
        if any(v < 0 or not math.isfinite(v) for v in out) or sum(out) <= 0:
            raise RefError(f"config key {where}: weights must be >= 0 with a positive sum, got {value!r}")
        return out
    if kind == "layer_freq":
        return moe_ref.convert_layer_freq(where, value, RefError)
    if kind == "modules":
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not all(n in ("core_attn", "moe_act", "layernorm", "moe", "mlp", "shared_experts") for n in names):
            raise RefError(f"config key {where}: expected a list of core_attn | moe_act | layernorm | moe | mlp | shared_experts, got {value!r}")
        return names
    raise AssertionError(kind)


def load_config(path, overrides, allow_defaults=False):
    try:
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
    except OSError as e:
        raise RefError(f"cannot read config {path}: {e}")
    except yaml.YAMLError as e:
        raise RefError(f"config {path} is not valid YAML: {e}")
    if not isinstance(raw, dict):
        raise RefError(f"config {path}: top level must be a mapping of sections")
    for ov in overrides:
        if "=" not in ov or "." not in ov.split("=", 1)[0]:
            raise RefError(f"--set {ov!r}: expected section.key=value")
        key, val = ov.split("=", 1)
        sec, k = key.split(".", 1)
        raw.setdefault(sec, {})
        if not isinstance(raw[sec], dict):
            raise RefError(f"config section {sec} must be a mapping")
        raw[sec][k] = yaml.safe_load(val) if val != "" else None
    cfg = {}
    for sec, body in raw.items():
        if sec not in SCHEMA:
            raise RefError(f"unknown config section '{sec}'{_closest(sec, SCHEMA)}")
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise RefError(f"config section {sec} must be a mapping")
        for k in body:
            if k not in SCHEMA[sec]:
                raise RefError(f"unknown config key '{sec}.{k}'{_closest(k, SCHEMA[sec])}")
    for sec, keys in SCHEMA.items():
        body = raw.get(sec) or {}
        out = {}
        for k, (kind, default, relaxed, nullable) in keys.items():
            where = f"{sec}.{k}"
            if k in body:
                out[k] = _convert(where, kind, nullable, body[k])
            elif default is REQUIRED:
                raise RefError(f"config key {where} is required")
            elif default is EXPLICIT:
                if not allow_defaults:
                    raise RefError(f"config key {where} must be given explicitly to the reference "
                                   f"(DESIGN states no default; --allow-defaults uses {relaxed!r})")
                out[k] = relaxed
            else:
                out[k] = default
        cfg[sec] = out
    return _check_and_resolve(cfg)


def _check_and_resolve(cfg):
    m, t, o, d = cfg["model"], cfg["training"], cfg["optimizer"], cfg["data"]
    for sec, k in [("model", "num_layers"), ("model", "hidden_size"), ("model", "num_attention_heads"),
                   ("model", "seq_length"), ("model", "vocab_size"), ("training", "micro_batch_size"),
                   ("training", "train_iters"), ("logging", "log_interval")]:
        if cfg[sec][k] <= 0:
            raise RefError(f"config key {sec}.{k} must be > 0, got {cfg[sec][k]}")
    _check_arch(m)
    if m["ffn_hidden_size"] is None:
        m["ffn_hidden_size"] = 4 * m["hidden_size"]
    if m["max_position_embeddings"] is None:
        m["max_position_embeddings"] = m["seq_length"]
    moe_ref.check_config(m, cfg["parallel"], RefError)
    if m["max_position_embeddings"] < m["seq_length"]:
        raise RefError("model.max_position_embeddings must be >= model.seq_length")
    if m["hidden_dropout"] != 0.0 or m["attention_dropout"] != 0.0:
        raise RefError("the reference does not support dropout: model.hidden_dropout and "
                       "model.attention_dropout must be 0")
    if t["global_batch_size"] is None:
        raise RefError("training.global_batch_size: null means micro_batch_size * DP, which needs the "
                       "world size; give it explicitly to the reference")
    if t["global_batch_size"] % t["micro_batch_size"]:
        raise RefError("training.global_batch_size must be a multiple of training.micro_batch_size")
    if t["precision"] not in ("fp32", "bf16", "fp16"):
        raise RefError(f"training.precision must be fp32|bf16|fp16, got {t['precision']!r}")
    if t["fp8_format"] is not None:
        if t["fp8_format"] not in ("e4m3", "hybrid"):
            raise RefError(f"training.fp8_format must be null|e4m3|hybrid, got {t['fp8_format']!r}")
        if t["fp8_recipe"] not in ("tensorwise", "delayed", "blockwise"):
            raise RefError(f"training.fp8_recipe must be delayed|tensorwise|blockwise, got {t['fp8_recipe']!r}")
    if t["recompute"] not in ("none", "selective", "full"):
        raise RefError(f"training.recompute must be none|selective|full, got {t['recompute']!r}")
    if o["lr_decay_style"] not in ("cosine", "linear", "constant"):
        raise RefError(f"optimizer.lr_decay_style must be cosine|linear|constant, got {o['lr_decay_style']!r}")
    if o["lr_decay_iters"] is None:
        o["lr_decay_iters"] = t["train_iters"]
    if o["lr_warmup_iters"] < 0 or o["lr_decay_iters"] < 0:
        raise RefError("optimizer.lr_warmup_iters and optimizer.lr_decay_iters must be >= 0")
    if o["clip_grad"] < 0:
        raise RefError("optimizer.clip_grad must be >= 0 (0 disables clipping)")
    for k in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype"):
        if o[k] not in (("fp32", "fp16") if k == "main_params_dtype" else ("fp32", "bf16", "fp16")):
            raise RefError(f"optimizer.{k} must be fp32|bf16|fp16 (master: fp32|fp16), got {o[k]!r}")
        if o[k] != "fp32" and not o["use_precision_aware_optimizer"]:
            raise RefError(f"optimizer.{k}: {o[k]} needs optimizer.use_precision_aware_optimizer")
    if o["main_params_dtype"] == "fp16" and t["precision"] != "fp32":
        raise RefError("optimizer.main_params_dtype: fp16 in the reference only with training.precision fp32 "
                       "(its parameters are the master weights)")
    if o["main_grads_dtype"] not in ("fp32", "bf16"):
        raise RefError(f"optimizer.main_grads_dtype must be fp32|bf16, got {o['main_grads_dtype']!r}")
    if o["main_grads_dtype"] != "fp32" and not o["use_precision_aware_optimizer"]:
        raise RefError("optimizer.main_grads_dtype: bf16 needs optimizer.use_precision_aware_optimizer")
    if d["shuffle"]:
        raise RefError("the reference supports only data.shuffle: false")
    if cfg["checkpoint"]["load"] is not None:
        raise RefError("the reference cannot resume: checkpoint.load must be null")
    if cfg["logging"]["log_interval"] != 1:
        raise RefError("the reference logs every iteration: logging.log_interval must be 1")
    return cfg


def _check_arch(m):
    """The LLaMA-family keys: what the reference can compute, or a RefError naming the key."""
    H = m["num_attention_heads"]
    if m["kv_channels"] is None and m["hidden_size"] % H:
        raise RefError("model.hidden_size must be divisible by model.num_attention_heads "
                       "(or give model.kv_channels)")
    if m["kv_channels"] is not None and m["kv_channels"] <= 0:
        raise RefError(f"model.kv_channels must be > 0, got {m['kv_channels']}")
    if m["normalization"] not in ("LayerNorm", "RMSNorm"):
        raise RefError(f"model.normalization must be LayerNorm|RMSNorm, got {m['normalization']!r}")
    if m["position_embedding_type"] not in ("learned_absolute", "rope"):
        raise RefError(f"model.position_embedding_type must be learned_absolute|rope, "
                       f"got {m['position_embedding_type']!r}")
    if m["group_query_attention"]:
        G = m["num_query_groups"]
        if G is None or G <= 0 or H % G:
            raise RefError(f"model.num_query_groups must divide model.num_attention_heads ({H}) "
                           f"with group_query_attention, got {G}")
    elif m["num_query_groups"] is not None:
        raise RefError("model.num_query_groups needs model.group_query_attention: true")
    if m["swiglu"] and m["ffn_hidden_size"] is None:
        raise RefError("model.ffn_hidden_size must be given with model.swiglu")
    if m["position_embedding_type"] == "rope":
        D = m["kv_channels"] or m["hidden_size"] // H
        rot = int(D * m["rotary_percent"])
        if not 0 < m["rotary_percent"] <= 1 or rot < 2 or rot % 2:
            raise RefError(f"model.rotary_percent {m['rotary_percent']} of kv_channels {D} gives {rot} "
                           f"rotated channels: must be even and > 0")
        if m["rotary_base"] <= 0:
            raise RefError("model.rotary_base must be > 0")


def check_hf_gpt2_init(m, path):
    if not is_gpt2(m):
        raise RefError(f"{path}: the reference imports HF GPT-2 weights only; for the LLaMA-family options "
                       f"set model.init_from: null (tptrain's own init)")


def padded_vocab(vocab, divisible_by, tp=1):
    mult = divisible_by * tp
    return (vocab + mult - 1) // mult * mult


# ----------------------------------------------------------------------------------------------
# LR schedule (DESIGN Numerics; Megatron's OptimizerParamScheduler.get_lr with k = iteration).

def lr_at(k, lr, min_lr, warmup, decay_iters, style):
    if warmup > 0 and k <= warmup:
        return lr * k / warmup
    if style == "constant":
        return lr
    if k > decay_iters:
        return min_lr
    ratio = (k - warmup) / (decay_iters - warmup)
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        raise RefError(f"unknown lr_decay_style {style!r}")
    return min_lr + coeff * (lr - min_lr)


# ----------------------------------------------------------------------------------------------
# safetensors reader: u64 LE header length, JSON header {name: {dtype, shape, data_offsets}}, data.

def _bf16_to_f32(raw_u16):
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


_ST_DTYPES = {"F64": (np.dtype("<f8"), None), "F32": (np.dtype("<f4"), None),
              "F16": (np.dtype("<f2"), None), "BF16": (np.dtype("<u2"), _bf16_to_f32)}


def read_safetensors(path):
    """Returns {name: float64 numpy array} (exact for F16/BF16/F32/F64 sources)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise RefError(f"cannot read weights {path}: {e}")
    if len(blob) < 8:
        raise RefError(f"{path}: too short to be a safetensors file")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        raise RefError(f"{path}: header length {hlen} runs past the end of the file")
    try:
        header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RefError(f"{path}: bad JSON header: {e}")
    data = memoryview(blob)[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        if dt not in _ST_DTYPES:
            raise RefError(f"{path}: tensor {name} has unsupported dtype {dt}")
        np_dt, post = _ST_DTYPES[dt]
        shape = [int(s) for s in info["shape"]]
        b, e = (int(x) for x in info["data_offsets"])
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= b <= e <= len(data)) or e - b != count * np_dt.itemsize:
            raise RefError(f"{path}: tensor {name} has data_offsets {[b, e]} inconsistent with "
                           f"shape {shape} {dt} and data size {len(data)}")
        arr = np.frombuffer(data[b:e], dtype=np_dt)
        if post is not None:
            arr = post(arr)
        out[name] = arr.astype(np.float64).reshape(shape)
    return out


def hf_to_state(tensors, cfg_model, path="weights"):
    """Maps HF GPT-2 names (Conv1D layout [in, out]) to this file's GPT parameters (tptrain's names,
    nn.Linear layout [out, in]). Returns {param name: float64 array}."""
    check_hf_gpt2_init(cfg_model, path)
    L = cfg_model["num_layers"]
    C = cfg_model["hidden_size"]
    Fh = cfg_model["ffn_hidden_size"]
    V = cfg_model["vocab_size"]
    P = cfg_model["max_position_embeddings"]
    t = {}
    for name, arr in tensors.items():
        short = name[len("transformer."):] if name.startswith("transformer.") else name
        if short in t:
            raise RefError(f"{path}: tensor {short} appears twice (with and without 'transformer.')")
        t[short] = arr
    lm_head = t.pop("lm_head.weight", None)
    state = {}
    used = set()

    def take(name, shape, rows_at_least=None):
        if name not in t:
            raise RefError(f"{path}: missing tensor {name}")
        a = t[name]
        used.add(name)
        if rows_at_least is not None:
            if a.ndim != 2 or a.shape[1] != shape[1] or a.shape[0] < rows_at_least:
                raise RefError(f"{path}: {name} has shape {list(a.shape)}, expected [>={rows_at_least}, {shape[1]}]")
            return a[:rows_at_least]
        if list(a.shape) != list(shape):
            raise RefError(f"{path}: {name} has shape {list(a.shape)}, expected {list(shape)}")
        return a

    state["wte.weight"] = take("wte.weight", [V, C], rows_at_least=V)
    state["wpe.weight"] = take("wpe.weight", [P, C], rows_at_least=P)
    for i in range(L):
        h = f"h.{i}."
        state[h + "ln_1.weight"] = take(h + "ln_1.weight", [C])
        state[h + "ln_1.bias"] = take(h + "ln_1.bias", [C])
        state[h + "attn.qkv.weight"] = take(h + "attn.c_attn.weight", [C, 3 * C]).T
        state[h + "attn.qkv.bias"] = take(h + "attn.c_attn.bias", [3 * C])
        state[h + "attn.proj.weight"] = take(h + "attn.c_proj.weight", [C, C]).T
        state[h + "attn.proj.bias"] = take(h + "attn.c_proj.bias", [C])
        state[h + "ln_2.weight"] = take(h + "ln_2.weight", [C])
        state[h + "ln_2.bias"] = take(h + "ln_2.bias", [C])
        state[h + "mlp.fc1.weight"] = take(h + "mlp.c_fc.weight", [C, Fh]).T
        state[h + "mlp.fc1.bias"] = take(h + "mlp.c_fc.bias", [Fh])
        state[h + "mlp.fc2.weight"] = take(h + "mlp.c_proj.weight", [Fh, C]).T
        state[h + "mlp.fc2.bias"] = take(h + "mlp.c_proj.bias", [C])
        used.update({h + "attn.bias", h + "attn.masked_bias"})  # HF causal-mask buffers
    state["ln_f.weight"] = take("ln_f.weight", [C])
    state["ln_f.bias"] = take("ln_f.bias", [C])
    extra = sorted(n for n in t if n not in used)
    if extra:
        raise RefError(f"{path}: unexpected tensors {extra[:5]} (num_layers={L}?)")
    if lm_head is not None and not np.array_equal(lm_head[:V], t["wte.weight"][:V]):
        raise RefError(f"{path}: lm_head.weight differs from wte.weight, but the LM head is tied")
    return state


# ----------------------------------------------------------------------------------------------
# Token data: Megatron .idx/.bin and llm.c shards, read independently of tptrain.

_MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
LLMC_MAGIC = 20240520


def read_megatron(prefix):
    """Returns a list of documents (numpy int64 arrays). A document for splitting is one entry of
    `sizes`, as Megatron's GPT dataset splits (one sequence per document after preprocessing)."""
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    with open(idx_path, "rb") as f:
        idx = f.read()
    hdr = 9 + 8 + 1 + 8 + 8
    if len(idx) < hdr or idx[:9] != b"MMIDIDX\x00\x00":
        raise RefError(f"{idx_path}: not a Megatron index (bad magic)")
    (version,) = struct.unpack_from("<Q", idx, 9)
    (code,) = struct.unpack_from("<B", idx, 17)
    nseq, ndoc = struct.unpack_from("<QQ", idx, 18)
    if version != 1:
        raise RefError(f"{idx_path}: version {version}, expected 1")
    if code not in _MEGATRON_DTYPES:
        raise RefError(f"{idx_path}: dtype code {code} is not an integer token type")
    need = hdr + 4 * nseq + 8 * nseq + 8 * ndoc
    if len(idx) != need:
        raise RefError(f"{idx_path}: {len(idx)} bytes, expected {need} for {nseq} sequences, {ndoc} doc-index entries")
    sizes = np.frombuffer(idx, dtype="<i4", count=nseq, offset=hdr).astype(np.int64)
    ptrs = np.frombuffer(idx, dtype="<i8", count=nseq, offset=hdr + 4 * nseq)
    doc_idx = np.frombuffer(idx, dtype="<i8", count=ndoc, offset=hdr + 12 * nseq)
    if ndoc < 1 or doc_idx[0] != 0 or doc_idx[-1] != nseq or np.any(np.diff(doc_idx) < 0):
        raise RefError(f"{idx_path}: document index must rise from 0 to the sequence count {nseq}")
    dt = np.dtype(_MEGATRON_DTYPES[code]).newbyteorder("<")
    tokens = np.fromfile(bin_path, dtype=dt)
    nbytes = os.path.getsize(bin_path)
    docs = []
    for i in range(nseq):
        if sizes[i] < 0 or ptrs[i] < 0 or ptrs[i] % dt.itemsize or ptrs[i] + sizes[i] * dt.itemsize > nbytes:
            raise RefError(f"{idx_path}: sequence {i} (pointer {ptrs[i]}, size {sizes[i]}) lies outside {bin_path}")
        s = ptrs[i] // dt.itemsize
        docs.append(tokens[s:s + sizes[i]].astype(np.int64))
    return docs


def read_llmc(path):
    raw = np.fromfile(path, dtype="<i4", count=256)
    if raw.size < 256 or raw[0] != LLMC_MAGIC or raw[1] != 1:
        raise RefError(f"{path}: not an llm.c shard (magic/version)")
    count = int(raw[2])
    if os.path.getsize(path) != 1024 + 2 * count:
        raise RefError(f"{path}: {os.path.getsize(path)} bytes, expected {1024 + 2 * count} for {count} tokens")
    return np.fromfile(path, dtype="<u2", offset=1024).astype(np.int64)


def _is_llmc(path):
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) == 4 and struct.unpack("<i", head)[0] == LLMC_MAGIC


def open_corpus(path, vocab):
    """data.path: a Megatron prefix, an llm.c shard, or a glob of shards (sorted, one document each)."""
    if any(ch in path for ch in "*?["):
        files = sorted(glob.glob(path))
        if not files:
            raise RefError(f"data.path {path}: no files match")
        docs = [read_llmc(p) for p in files]
    elif os.path.isfile(path + ".idx") and os.path.isfile(path + ".bin"):
        docs = read_megatron(path)
    elif os.path.isfile(path) and _is_llmc(path):
        docs = [read_llmc(path)]
    elif path.endswith(".bin") and os.path.isfile(path[:-4] + ".idx"):
        docs = read_megatron(path[:-4])
    else:
        raise RefError(f"data.path {path}: neither a Megatron prefix (.idx/.bin) nor an llm.c shard")
    for i, d in enumerate(docs):
        if d.size and (d.min() < 0 or d.max() >= vocab):
            raise RefError(f"data.path {path}: document {i} has a token outside [0, {vocab})")
    return docs


def split_documents(n, weights, rule="megatron"):
    """[begin, end) document ranges of train/valid/test.
    megatron: Megatron-LM's get_train_valid_test_split_ (cumulative sum of round(fraction*n), with
              Python's round-half-to-even, then every boundary shifted so the last is n).
    cumsum:   boundaries round(cumsum(fraction)*n), last = n."""
    w = list(weights) + [0.0] * (3 - len(weights))
    total = sum(w)
    frac = [x / total for x in w]
    if rule == "megatron":
        idx = [0]
        for fr in frac:
            idx.append(idx[-1] + int(round(fr * float(n))))
        diff = idx[-1] - n
        idx = [idx[0]] + [x - diff for x in idx[1:]]
    elif rule == "cumsum":
        c = np.cumsum(frac)
        idx = [0, int(round(c[0] * n)), int(round(c[1] * n)), n]
    else:
        raise RefError(f"unknown split rule {rule}")
    return [(idx[i], idx[i + 1]) for i in range(3)]


class SequentialData:
    """Train documents concatenated into one stream; sample i = tokens [i*S, i*S+S+1); iteration k
    (1-based) uses samples (k-1)*G ... k*G-1, each modulo the number of samples."""

    def __init__(self, docs, doc_range, seq):
        b, e = doc_range
        parts = docs[b:e]
        self.stream = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        self.seq = seq
        self.num_samples = max(0, (self.stream.size - 1) // seq)
        if self.num_samples == 0:
            raise RefError(f"train split has {self.stream.size} tokens: not even one sample of "
                           f"{seq} + 1 tokens")

    def sample(self, position):
        i = position % self.num_samples
        return self.stream[i * self.seq: i * self.seq + self.seq + 1]

    def batch(self, positions):
        return torch.from_numpy(np.stack([self.sample(p) for p in positions]))  # (B, S+1)


def make_optimizer(model, o):
    decay = [p for n, p in model.named_parameters() if is_decayed(n)]
    no_decay = [p for n, p in model.named_parameters() if not is_decayed(n)]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["adam_beta1"], o["adam_beta2"]),
                            eps=o["adam_eps"], foreach=False)
    # the precision-aware optimizer's bf16 moments: the step's math in fp32 from the stored values,
    # the result stored rounded to nearest even (round_moments after each step)
    opt.bf16_moments = [name for name, key in (("exp_avg", "exp_avg_dtype"), ("exp_avg_sq", "exp_avg_sq_dtype"))
                        if o.get(key, "fp32") == "bf16"]
    # fp16 moments / master weights: Transformer Engine's per-tensor scaled fp16 (fp16_scaled), each
    # tensor whole (tptrain reduces the amax over the ranks holding its parts)
    opt.fp16_moments = [name for name, key in (("exp_avg", "exp_avg_dtype"), ("exp_avg_sq", "exp_avg_sq_dtype"))
                        if o.get(key, "fp32") == "fp16"]
    opt.fp16_master = o.get("main_params_dtype", "fp32") == "fp16"
    if opt.fp16_master:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(fp16_scaled(p))
    return opt


def fp16_scaled(x):
    """x as Transformer Engine's FusedAdam stores an fp16 state: scale = absmax / (65504 / 2) in fp32,
    codes fp16(x * (1 / scale)) (0 for an all-zero tensor), read back as code * scale in fp32."""
    absmax = x.detach().abs().max().to(torch.float32)
    scale = absmax / torch.tensor(65504.0 / 2, dtype=torch.float32)
    rscale = torch.where(scale > 0, scale.reciprocal(), torch.zeros_like(scale))
    return ((x.to(torch.float32) * rscale).to(torch.float16).to(torch.float32) * scale).to(x.dtype)


def round_moments(opt):
    """Stores the moments named in opt.bf16_moments as bf16 (kept in fp32 tensors, rounded), those in
    opt.fp16_moments and with opt.fp16_master the parameters as scaled fp16."""
    for name in getattr(opt, "bf16_moments", []):
        for state in opt.state.values():
            state[name].copy_(state[name].to(torch.bfloat16).to(state[name].dtype))
    with torch.no_grad():
        for name in getattr(opt, "fp16_moments", []):
            for state in opt.state.values():
                state[name].copy_(fp16_scaled(state[name]))
        if getattr(opt, "fp16_master", False):
            for g in opt.param_groups:
                for p in g["params"]:
                    p.copy_(fp16_scaled(p))


def bf16_round(x):
    return x.to(torch.bfloat16).to(x.dtype)


def train_step(model, opt, micro_batches, lr, clip_grad, bf16_grads=None):
    """One iteration: gradient of the mean loss over all tokens of the global batch (equal-sized
    micro-batches, each loss divided by their number) plus, with MoE layers, each micro-batch's
    balancing losses weighed as its loss (docs/MOE.md "Balancing losses"), pre-clip global norm,
    clip, AdamW. Returns (lm_loss, grad_norm) with the loss of the parameters before the update;
    model.moe_stats: the logged MoE values (after the expert bias update).
    bf16_grads = (DP, PP) with DP > 0: the bf16 gradient buffer (parallel.grad_reduce_in_bf16) of DP
    ranks, micro-batch i on rank i % DP: each rank's gradient stored in bf16, each micro-batch's added
    in fp32 and rounded once (as one weight-gradient GEMM into the buffer does); a tied word
    embedding's two gradients added apart, the output layer's first (PP > 1: in two buffers, the last
    and the first stage's, summed over the embedding group, one rounding); then the ranks' buffers
    summed in rank order, each addition rounded (DP <= 2: one rounding, whatever the reduction's
    order)."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=False)
    n = len(micro_batches)
    total = 0.0
    moe = moe_ref.StepStats(model.moe_layers())
    params = list(model.parameters())
    dp, pp = bf16_grads or (0, 1)
    tied = model.a["tied"] and dp > 0
    # per DP rank: each parameter's buffer, and with PP > 1 the last stage's copy of the tied embedding
    ranks = [[torch.zeros_like(p) for p in params] for _ in range(dp)]
    heads = [torch.zeros_like(model.wte.weight) for _ in range(dp)] if tied and pp > 1 else None
    model.tied_parts = {} if tied else None
    for i, mb in enumerate(micro_batches):
        moe.prepare(i, n, lambda j: model.loss(micro_batches[j]))
        loss = model.loss(mb)
        ((loss + moe.objective_terms()) / n).backward()
        total += float(loss.detach())
        if dp:
            with torch.no_grad():
                for acc, p in zip(ranks[i % dp], params):
                    if tied and p is model.wte.weight:
                        head, emb = model.tied_parts["head"], model.tied_parts["embedding"]
                        if heads is not None:
                            heads[i % dp].copy_(bf16_round(heads[i % dp] + head))
                            acc.copy_(bf16_round(acc + emb))
                        else:
                            acc.copy_(bf16_round(bf16_round(acc + head) + emb))
                    else:
                        acc.copy_(bf16_round(acc + p.grad))
                    p.grad.zero_()
    model.tied_parts = None
    if dp:
        with torch.no_grad():
            for j, p in enumerate(params):
                if heads is not None and p is model.wte.weight:
                    for r in range(dp):
                        ranks[r][j].copy_(bf16_round(ranks[r][j] + heads[r]))
                p.grad.copy_(ranks[0][j])
                for r in range(1, dp):
                    p.grad.copy_(bf16_round(p.grad + ranks[r][j]))
    model.moe_stats = moe.finish() if moe.layers else {}
    gn = clip_and_step(model, opt, clip_grad)
    return total / n, gn


def clip_and_step(model, opt, clip_grad):
    """The global gradient norm before clipping (clipped to clip_grad when > 0), then the update."""
    params = [p for p in model.parameters()]
    if clip_grad > 0:
        gn = torch.nn.utils.clip_grad_norm_(params, max_norm=clip_grad)
    else:
        gn = torch.norm(torch.stack([p.grad.detach().norm(2) for p in params]), 2)
    opt.step()
    round_moments(opt)
    return float(gn)


def run_training(cfg, init_path, steps, out_path, dtype=torch.float32, split_rule="megatron",
                 log=None):
    log = log or sys.stderr
    m, t, o, d = cfg["model"], cfg["training"], cfg["optimizer"], cfg["data"]
    if t["precision"] != "fp32":
        print(f"gpt_ref: note: training.precision={t['precision']}; the reference computes in "
              f"{dtype} anyway", file=log)
    model = build_model(m, dtype)
    if t["fp8_format"] is not None:
        layers = fp8_train_ref.enable_fp8(model, t)
        print(f"gpt_ref: FP8 {t['fp8_format']} {t['fp8_recipe']} (emulated) in layers {layers}, "
              f"margin {t['fp8_margin']}, fp8_wgrad {t['fp8_wgrad']}"
              + (f", amax history {t['fp8_amax_history_len']} {t['fp8_amax_compute_algo']}"
                 if t["fp8_recipe"] == "delayed" else ""), file=log)
    moe_ref.set_data_parallel(model, cfg["parallel"], RefError)
    moe = init_path and hf_moe_ref.is_hf_moe(init_path)
    if init_path and (moe or hf_llama_ref.is_hf_llama(init_path)):  # an HF Llama / MoE directory / index / file
        try:
            hf_cfg, tensors = hf_llama_ref.read_checkpoint(init_path, read_safetensors)
            model.load_state((hf_moe_ref if moe else hf_llama_ref).to_state(hf_cfg, tensors, m))
        except hf_llama_ref.HFLlamaError as e:
            raise RefError(f"{init_path}: {e}")
        print(f"gpt_ref: Hugging Face {hf_moe_ref.family(init_path) if moe else 'Llama'} weights from {init_path}",
              file=log)
    elif init_path:
        check_hf_gpt2_init(m, init_path)
        model.load_state(hf_to_state(read_safetensors(init_path), m, init_path))
    else:
        print(f"gpt_ref: tptrain's Philox init, seed {t['seed']}", file=log)
        model.load_state(tptrain_init_state(model, m, t["seed"]))
    docs = open_corpus(d["path"], m["vocab_size"])
    rng = split_documents(len(docs), d["split"], split_rule)
    data = SequentialData(docs, rng[0], m["seq_length"])
    opt = make_optimizer(model, o)
    G, mb = t["global_batch_size"], t["micro_batch_size"]
    bf16_grads = None
    if cfg["parallel"]["grad_reduce_in_bf16"] or o["main_grads_dtype"] == "bf16":
        par = cfg["parallel"]
        if d.get("eod_mask_loss") or d.get("reset_position_ids"):
            raise RefError("the reference's bf16 gradient buffer is not built with data.eod_mask_loss / reset_position_ids")
        if par["sequence_parallel"] or par["context_parallel_size"] > 1 or m.get("num_moe_experts"):
            raise RefError("the reference's bf16 gradient buffer does not emulate the partial sums of sequence or "
                           "context parallelism, or MoE layers")
        bf16_grads = (par["data_parallel_size"] or 1, par["pipeline_model_parallel_size"])
        print(f"gpt_ref: bf16 gradient buffer over DP {bf16_grads[0]}, PP {bf16_grads[1]}"
              + ("" if par["data_parallel_size"] else " (parallel.data_parallel_size null: 1)"), file=log)
    print(f"gpt_ref: {len(docs)} documents, train split {rng[0]}, {data.stream.size} tokens, "
          f"{data.num_samples} samples; G={G} micro={mb} ({G // mb} micro-batches); dtype {dtype}",
          file=log)
    out = open(out_path, "w") if out_path else None
    try:
        for k in range(1, steps + 1):
            lr = lr_at(k, o["lr"], o["min_lr"], o["lr_warmup_iters"], o["lr_decay_iters"],
                       o["lr_decay_style"])
            positions = list(range((k - 1) * G, k * G))
            micro = [data.batch(positions[j:j + mb]) for j in range(0, G, mb)]
            if d.get("eod_mask_loss") or d.get("reset_position_ids"):
                eod = d.get("eod_token_id")
                eod = m["vocab_size"] - 1 if eod is None else eod
                from doc_masks_ref import train_step_doc  # tests/reference/doc_masks_ref.py
                loss, gn = train_step_doc(model, opt, micro, lr, o["clip_grad"], eod,
                                          d.get("reset_position_ids"), d.get("eod_mask_loss"))
            else:
                loss, gn = train_step(model, opt, micro, lr, o["clip_grad"], bf16_grads)
            fp8_train_ref.end_step(model)  # delayed scaling: the next step's scales
            rec = {"iteration": k, "consumed_samples": k * G, "lm_loss": loss, "grad_norm": gn, "lr": lr}
            rec.update(model.moe_stats)
            print(f"gpt_ref: iteration {k}/{steps} | lm loss {loss:.6E} | grad norm {gn:.6f} | "
                  f"learning rate {lr:.6E}" + "".join(f" | {n} {v:.6E}" for n, v in model.moe_stats.items()),
                  file=log)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()
    finally:
        if out:
            out.close()
    return model


# ----------------------------------------------------------------------------------------------
# Bench: forward + backward + AdamW step on random tokens.

def megatron_flops(B, s, l, h, V):
    return 72.0 * B * s * l * h * h * (1.0 + s / (12.0 * h) + V / (12.0 * l * h))


def bench(a):
    torch.manual_seed(0)
    if a.threads:
        torch.set_num_threads(a.threads)
    C, H = a.hidden, a.heads
    model = GPT({"num_layers": a.layers, "hidden_size": C, "num_attention_heads": H, "ffn_hidden_size": 4 * C,
                 "vocab_size": a.vocab, "max_position_embeddings": a.seq, "layernorm_epsilon": 1e-5})
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=False)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=g) for _ in range(a.iters + 1)]

    def step(tokens):
        opt.zero_grad(set_to_none=False)
        model.loss(tokens).backward()
        opt.step()

    t0 = time.perf_counter()
    step(batches[0])
    warm = time.perf_counter() - t0
    times = []
    for i in range(a.iters):
        t0 = time.perf_counter()
        step(batches[i + 1])
        times.append(time.perf_counter() - t0)
    total = sum(times)
    tokens = a.micro_batch * a.seq
    nparams = sum(p.numel() for p in model.parameters())
    fl = megatron_flops(a.micro_batch, a.seq, a.layers, C, a.vocab)
    vpad = padded_vocab(a.vocab, 128)
    fl_pad = megatron_flops(a.micro_batch, a.seq, a.layers, C, vpad)
    print(f"bench: layers={a.layers} hidden={C} heads={H} vocab={a.vocab} seq={a.seq} "
          f"micro_batch={a.micro_batch} threads={torch.get_num_threads()} params={nparams / 1e6:.2f}M "
          f"torch={torch.__version__}")
    print(f"bench: warmup step {warm * 1e3:.1f} ms; steps (ms): " + " ".join(f"{x * 1e3:.1f}" for x in times))
    print(f"bench: mean {total / a.iters * 1e3:.1f} ms/iter, min {min(times) * 1e3:.1f} ms")
    print(f"bench: tokens/s {tokens * a.iters / total:.1f} (best step {tokens / min(times):.1f})")
    print(f"bench: model TFLOP/s {fl * a.iters / total / 1e12:.4f} (best step {fl / min(times) / 1e12:.4f}); "
          f"{fl / 1e9:.2f} GFLOP/iter by 72*B*s*l*h^2*(1+s/(12h)+V/(12lh)) with V={a.vocab} "
          f"[{fl_pad * a.iters / total / 1e12:.4f} TFLOP/s with padded V={vpad}]")


# ----------------------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="tptrain YAML config")
    p.add_argument("--init", help="HF GPT-2 safetensors file or HF Llama checkpoint (directory, index, file with "
                                  "config.json beside it) (default: model.init_from; null: tptrain's init)")
    p.add_argument("--steps", type=int, help="iterations to run (default: training.train_iters)")
    p.add_argument("--out", help="metrics JSON lines (iteration, consumed_samples, lm_loss, grad_norm, lr)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--float64", action="store_true", help="compute in float64 instead of fp32")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--allow-defaults", action="store_true",
                   help="fill keys DESIGN gives no default for with core/config.h's defaults")
    p.add_argument("--split-rule", choices=["megatron", "cumsum"], default="megatron",
                   help="document split rule (they differ only in rounding corner cases)")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--iters", type=int, default=5)
    a = p.parse_args(argv)
    if a.bench:
        bench(a)
        return 0
    if not a.config:
        p.error("--config is required (or --bench)")
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        cfg = load_config(a.config, a.set, a.allow_defaults)
        init = a.init or cfg["model"]["init_from"]  # None: tptrain's init from training.seed
        steps = a.steps if a.steps is not None else cfg["training"]["train_iters"]
        run_training(cfg, init, steps, a.out, torch.float64 if a.float64 else torch.float32,
                     a.split_rule)
    except RefError as e:
        print(f"gpt_ref: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
