"""The Mixture-of-Experts MLP of the PyTorch reference (model_ref.py, gpt_ref.py), written from the
contract docs/MOE.md (Megatron-core's router.py / moe_utils.py semantics) in plain torch: a router,
E experts looped over one by one, an optional shared expert with its sigmoid gate, every routing
option (softmax / sigmoid scores, pre-softmax, top-k scaling, group-limited top-k, the expert bias),
capacity with both drop policies, the balancing losses (aux_loss, seq_aux_loss) and the z-loss.

Token order: a micro-batch's (B, S) tokens are routed in tptrain's order, row t = b * S + s (docs/MOE.md
"Capacity": the earlier token is the one kept; Megatron's [s, b] activations order them s * B + b
instead, so its dropped set differs where capacity binds). Ties in every top-k: the lower index wins.

Parameters, by tptrain's global names and global shapes (init_ref.py indexes them flat):
  mlp.router.weight (E, C); mlp.experts.fc1.weight (E, Fe, C), SwiGLU (E, 2 Fe, C) = per expert
  [gate; up]; fc1.bias (E, Fe | 2 Fe); fc2.weight (E, C, Fe); fc2.bias (E, C); mlp.shared_experts.*
  as the dense MLP with width Fs; mlp.shared_experts.gate.weight (1, C). The expert bias (sigmoid
  scores only) is a buffer, not a parameter: it is updated once per global batch, never by AdamW."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# model.* keys (gpt_ref.SCHEMA's form: kind, default, --allow-defaults default, nullable); docs/MOE.md
MODEL_KEYS = {
    "num_moe_experts": ("int", None, None, True),              # null: a dense model
    "moe_ffn_hidden_size": ("int", None, None, True),          # null: ffn_hidden_size
    "moe_layer_freq": ("layer_freq", 1, None, False),          # int N or a 0/1 list per layer
    "moe_router_topk": ("int", 2, None, False),
    "moe_router_score_function": ("str", "softmax", None, False),
    "moe_router_pre_softmax": ("bool", False, None, False),
    "moe_router_topk_scaling_factor": ("float", None, None, True),
    "moe_router_num_groups": ("int", None, None, True),
    "moe_router_group_topk": ("int", None, None, True),
    "moe_router_enable_expert_bias": ("bool", False, None, False),
    "moe_router_bias_update_rate": ("float", 1.0e-3, None, False),
    "moe_router_load_balancing_type": ("str", "aux_loss", None, False),
    "moe_aux_loss_coeff": ("float", 0.0, None, False),
    "moe_z_loss_coeff": ("float", None, None, True),
    "moe_shared_expert_intermediate_size": ("int", None, None, True),
    "moe_shared_expert_gate": ("bool", False, None, False),
    "moe_expert_capacity_factor": ("float", None, None, True),
    "moe_token_drop_policy": ("str", "probs", None, False),
    "moe_pad_expert_input_to_capacity": ("bool", False, None, False),
    "moe_token_dispatcher_type": ("str", "alltoall", None, False),  # where tokens travel: no math
    "moe_dispatch_bound_factor": ("float", 2.0, None, False),       # buffer sizes: no math
    "moe_kept_rows_factor": ("float", 1.25, None, False),           # buffer sizes: no math
    "moe_router_dtype": ("str", "fp32", None, False),
}
# parallel.* keys: the expert layout (no math on one process)
PARALLEL_KEYS = {
    "expert_model_parallel_size": ("int", 1, None, False),
    "expert_tensor_parallel_size": ("int", None, None, True),  # null: tensor_model_parallel_size
}


def convert_layer_freq(where, value, error):
    """model.moe_layer_freq: an int N >= 1 or a list of 0/1 (length checked against num_layers later)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, list) and value and all(v in (0, 1) and not isinstance(v, bool) for v in value):
        return list(value)
    raise error(f"config key {where}: expected an integer >= 1 or a list of 0/1 per layer, got {value!r}")


def check_config(m, p, error):
    """The MoE keys of the model section m (parallel section p): what the reference computes, or
    error(message naming the key). Resolves moe_ffn_hidden_size. Nothing to check for a dense model."""
    E = m["num_moe_experts"]
    if E is None:
        return
    if E < 1:
        raise error(f"model.num_moe_experts must be >= 1 (or null), got {E}")
    if m["moe_ffn_hidden_size"] is None:
        m["moe_ffn_hidden_size"] = m["ffn_hidden_size"]
    k, L = m["moe_router_topk"], m["num_layers"]
    freq = m["moe_layer_freq"]
    if isinstance(freq, list) and len(freq) != L:
        raise error(f"model.moe_layer_freq: a list needs num_layers ({L}) entries, got {len(freq)}")
    for key, choices in [("moe_router_score_function", ("softmax", "sigmoid")),
                         ("moe_token_drop_policy", ("probs", "position")),
                         ("moe_token_dispatcher_type", ("alltoall", "allgather")),
                         ("moe_router_dtype", ("fp32",))]:
        if m[key] not in choices:
            raise error(f"model.{key} must be {'|'.join(choices)}, got {m[key]!r}")
    lb = m["moe_router_load_balancing_type"]
    if lb not in ("aux_loss", "seq_aux_loss", "global_aux_loss", "none"):
        raise error(f"model.moe_router_load_balancing_type must be aux_loss|seq_aux_loss|global_aux_loss|none, "
                    f"got {lb!r}")
    if not 1 <= k <= E:
        raise error(f"model.moe_router_topk must be in [1, num_moe_experts = {E}], got {k}")
    for key in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size"):
        if m[key] is not None and m[key] <= 0:
            raise error(f"model.{key} must be > 0, got {m[key]}")
    G, Gk = m["moe_router_num_groups"], m["moe_router_group_topk"]
    if (G is None) != (Gk is None):
        raise error("model.moe_router_num_groups and model.moe_router_group_topk go together")
    if G is not None:
        if G <= 0 or E % G:
            raise error(f"model.moe_router_num_groups ({G}) must divide model.num_moe_experts ({E})")
        if not 1 <= Gk <= G:
            raise error(f"model.moe_router_group_topk must be in [1, moe_router_num_groups = {G}], got {Gk}")
        if k < Gk or k > Gk * (E // G):
            raise error(f"model.moe_router_topk ({k}) must be >= moe_router_group_topk ({Gk}) and <= the "
                        f"experts of the chosen groups ({Gk * (E // G)})")
    if m["moe_router_enable_expert_bias"] and m["moe_router_score_function"] != "sigmoid":
        raise error("model.moe_router_enable_expert_bias needs model.moe_router_score_function: sigmoid")
    cf = m["moe_expert_capacity_factor"]
    if cf is not None and cf <= 0:
        raise error(f"model.moe_expert_capacity_factor must be > 0 (or null: dropless), got {cf}")
    if m["moe_pad_expert_input_to_capacity"] and cf is None:
        raise error("model.moe_pad_expert_input_to_capacity needs model.moe_expert_capacity_factor")
    if m["moe_shared_expert_gate"] and m["moe_shared_expert_intermediate_size"] is None:
        raise error("model.moe_shared_expert_gate needs model.moe_shared_expert_intermediate_size")
    if m["moe_aux_loss_coeff"] < 0 or (m["moe_z_loss_coeff"] or 0.0) < 0:
        raise error("model.moe_aux_loss_coeff and model.moe_z_loss_coeff must be >= 0")
    ep, etp, tp = p["expert_model_parallel_size"], p["expert_tensor_parallel_size"], p["tensor_model_parallel_size"]
    if ep < 1 or E % ep:
        raise error(f"parallel.expert_model_parallel_size ({ep}) must divide model.num_moe_experts ({E})")
    if etp is not None and etp not in (1, tp):
        raise error(f"parallel.expert_tensor_parallel_size must be 1 or tensor_model_parallel_size ({tp}), got {etp}")


def set_data_parallel(model, parallel, error):
    """global_aux_loss sums its counts over the DP ranks' simultaneous micro-batches: the reference
    needs DP (parallel.data_parallel_size) to group its micro-batches as tptrain's ranks hold them."""
    for lyr in model.moe_layers():
        if lyr.moe["aux"] == "global_aux_loss":
            if parallel.get("data_parallel_size") is None:
                raise error("model.moe_router_load_balancing_type: global_aux_loss needs "
                            "parallel.data_parallel_size in the reference (its micro-batches' DP groups)")
            lyr.moe["dp"] = parallel["data_parallel_size"]


def resolve_moe(m):
    """The MoE architecture of a (checked) model config, or None for a dense model."""
    E = m.get("num_moe_experts")
    if not E:
        return None
    get = lambda k, d: m[k] if m.get(k) is not None else d  # noqa: E731
    freq = get("moe_layer_freq", 1)
    layers = [bool(freq[i]) for i in range(m["num_layers"])] if isinstance(freq, list) else \
        [i % freq == 0 for i in range(m["num_layers"])]
    lb = get("moe_router_load_balancing_type", "aux_loss")
    coeff = get("moe_aux_loss_coeff", 0.0)
    z = get("moe_z_loss_coeff", 0.0)
    return {"E": E, "Fe": get("moe_ffn_hidden_size", m["ffn_hidden_size"]), "layers": layers,
            "k": get("moe_router_topk", 2), "score": get("moe_router_score_function", "softmax"),
            "pre_softmax": get("moe_router_pre_softmax", False),
            "scaling": get("moe_router_topk_scaling_factor", None),
            "groups": get("moe_router_num_groups", None), "group_topk": get("moe_router_group_topk", None),
            "expert_bias": get("moe_router_enable_expert_bias", False),
            "bias_rate": get("moe_router_bias_update_rate", 1e-3),
            # Megatron's get_aux_loss_coeff: a balancing loss exists when its coefficient is > 0;
            # the z-loss when its coefficient is given (0 is tptrain's null: no z-loss)
            "aux": lb if lb != "none" and coeff > 0 else None, "aux_coeff": coeff,
            "z_coeff": z if z > 0 else None,
            "Fs": get("moe_shared_expert_intermediate_size", None),
            "shared_gate": get("moe_shared_expert_gate", False),
            "capacity": get("moe_expert_capacity_factor", None),
            "drop_policy": get("moe_token_drop_policy", "probs"),
            "pad": get("moe_pad_expert_input_to_capacity", False)}


# ----------------------------------------------------------------------------------------------
# Routing math on (N, E) logits, N tokens in routing order.

def topk_lower_index(scores, k):
    """The k largest of each row, ties to the lower index: (values (N, k), indices (N, k))."""
    idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
    return scores.gather(1, idx), idx


def select_experts(scores, k, groups=None, group_topk=None):
    """Indices (N, k) of the top-k of scores; group-limited: only among the experts of the group_topk
    groups (E / groups consecutive experts each) with the largest sums of their top (k / group_topk)."""
    if group_topk:
        N, E = scores.shape
        per_group = scores.reshape(N * groups, E // groups)
        group_scores = topk_lower_index(per_group, k // group_topk)[0].sum(-1).reshape(N, groups)
        chosen = topk_lower_index(group_scores, group_topk)[1]
        keep = torch.zeros(N, groups, dtype=torch.bool).scatter(1, chosen, True)
        scores = scores.masked_fill(~keep.repeat_interleave(E // groups, dim=1), float("-inf"))
    return topk_lower_index(scores, k)[1]


def route(z, moe, expert_bias=None):
    """docs/MOE.md "One MoE layer" step 2 on logits z (N, E): (probs (N, E), zero where not routed;
    routing map (N, E) bool)."""
    k, G, Gk = moe["k"], moe["groups"], moe["group_topk"]
    if moe["score"] == "softmax":
        if moe["pre_softmax"]:
            s = torch.softmax(z, dim=-1)
            idx = select_experts(s, k, G, Gk)
            p = s.gather(1, idx)
        else:
            idx = select_experts(z, k, G, Gk)
            p = torch.softmax(z.gather(1, idx), dim=-1)
    else:
        s = torch.sigmoid(z)
        idx = select_experts(s if expert_bias is None else s + expert_bias.to(s.dtype), k, G, Gk)
        p = s.gather(1, idx)
        if k > 1:
            p = p / (p.sum(-1, keepdim=True) + 1e-20)
    if moe["scaling"]:
        p = p * moe["scaling"]
    probs = torch.zeros_like(z).scatter(1, idx, p)
    routed = torch.zeros(z.shape, dtype=torch.bool).scatter(1, idx, True)
    return probs, routed


def expert_capacity(N, E, k, factor):
    """Megatron's get_capacity(N k, E, factor) = ceil((N k / E) * factor)."""
    return math.ceil((N * k / E) * factor)


def apply_capacity(probs, routed, k, factor, policy):
    """docs/MOE.md step 3: per expert at most capacity assignments; beyond it the lowest probabilities
    (ties: the later token) or the latest tokens are dropped. Returns (probs with the dropped ones 0,
    kept map, capacity)."""
    N, E = probs.shape
    cap = expert_capacity(N, E, k, factor)
    kept = routed.clone()
    for e in range(E):
        rows = torch.nonzero(routed[:, e]).flatten()           # ascending token order
        if rows.numel() <= cap:
            continue
        if policy == "probs":                                  # stable: equal probs keep the earlier token
            order = torch.sort(probs[rows, e].detach(), descending=True, stable=True).indices
            dropped = rows[order[cap:]]
        else:
            dropped = rows[cap:]
        kept[dropped, e] = False
    return probs * kept.to(probs.dtype), kept, cap


def aux_scores(z, moe):
    """Megatron's compute_routing_scores_for_aux_loss: (scores (N, E), plain top-k map (N, E) float)."""
    if moe["score"] == "softmax":
        s = torch.softmax(z, dim=-1)
    else:
        s = torch.sigmoid(z)
        s = s / (s.sum(-1, keepdim=True) + 1e-20)
    idx = topk_lower_index(s, moe["k"])[1]
    return s, torch.zeros_like(s).scatter(1, idx, 1.0).detach()


def switch_aux(s, counts, T, k, E):
    """E / (k T^2) * sum_e f_e P_e with f_e = counts, P_e = the scores' column sums (no coefficient)."""
    return (s.sum(0) * counts).sum() * (E / (k * T * T))


def balancing_losses(zb, moe, global_aux=None):
    """docs/MOE.md "Balancing losses" for one micro-batch and layer from logits zb (B, S, E): {name:
    (the loss with its coefficient, as it enters the objective; the value logged)}. global_aux_loss:
    global_aux = (the step's mean counts so far over TP x DP x CP (E,), that group's tokens T, DP), set
    by StepStats.prepare; None (its counting forward): no global term."""
    B, S, E = zb.shape
    out = {}
    k = moe["k"]
    if moe["aux"] == "global_aux_loss" and global_aux is not None:
        s, _ = aux_scores(zb.reshape(B * S, E), moe)
        f, T, dp = global_aux
        plain = switch_aux(s, f.to(s.dtype), T, k, E)  # this micro-batch's part of its DP group's loss
        # logged: the group's loss, the sum of its DP parts (Megatron's needs_dp_avg=False)
        out["global_load_balancing_loss"] = (moe["aux_coeff"] * plain, dp * float(plain.detach()))
    elif moe["aux"] in ("aux_loss", "seq_aux_loss"):
        s, fmap = aux_scores(zb.reshape(B * S, E), moe)
        if moe["aux"] == "aux_loss":
            plain = switch_aux(s, fmap.sum(0), B * S, k, E)
            name = "load_balancing_loss"
        else:
            s, fmap = s.reshape(B, S, E), fmap.reshape(B, S, E)
            plain = sum(switch_aux(s[b], fmap[b].sum(0), S, k, E) for b in range(B)) / B
            name = "seq_load_balancing_loss"
        out[name] = (moe["aux_coeff"] * plain, float(plain.detach()))
    if moe["z_coeff"]:
        lse2 = (torch.logsumexp(zb, dim=-1) ** 2).mean()
        out["z_loss"] = (moe["z_coeff"] * lse2, float(lse2.detach()))
    return out


# ----------------------------------------------------------------------------------------------
# The layer.

class _Linear3(nn.Module):
    """E stacked linear maps: weight (E, out, in), bias (E, out) when bias."""

    def __init__(self, E, n_out, n_in, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(E, n_out, n_in))
        if bias:
            self.bias = nn.Parameter(torch.zeros(E, n_out))

    def apply_one(self, e, x, bias=True):            # x (n, in) -> (n, out) with expert e's map
        y = x @ self.weight[e].t()
        return y + self.bias[e] if bias and hasattr(self, "bias") else y


class _Experts(nn.Module):
    def __init__(self, a, moe):
        super().__init__()
        self.swiglu, self.Fe = a["swiglu"], moe["Fe"]
        E, C = moe["E"], a["C"]
        self.fc1 = _Linear3(E, (2 if a["swiglu"] else 1) * self.Fe, C, a["bias"])
        self.fc2 = _Linear3(E, C, self.Fe, a["bias"])

    def forward(self, e, x, p):
        """Expert e on rows x (n, C) with their routing probabilities p (n, 1) -> its weighted rows (n, C):
        the probabilities applied inside the expert, as Megatron-core (and tptrain: docs/MOE.md
        "Dispatch") applies them -- fc2 of p x act, plus p x fc2's bias."""
        h = self.fc1.apply_one(e, x)
        if self.swiglu:
            gate, up = h.split(self.Fe, dim=-1)
            h = gate * torch.sigmoid(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        y = self.fc2.apply_one(e, p * h, bias=False)
        return y + p * self.fc2.bias[e] if hasattr(self.fc2, "bias") else y


class _Vector(nn.Module):
    def __init__(self, rows, cols):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, cols))


class MoEMLP(nn.Module):
    """The MoE MLP of one layer: x (B, T, C) -> (B, T, C). After each forward, self.terms holds the
    micro-batch's balancing losses (balancing_losses' form), self.kept_counts (E,) the assignments
    each expert computed (after capacity) and self.bias_counts (E,) what the expert bias update counts."""

    def __init__(self, a, mlp_cls):
        super().__init__()
        moe = self.moe = a["moe"]
        E, C = moe["E"], a["C"]
        self.router = _Vector(E, C)
        self.experts = _Experts(a, moe)
        if moe["Fs"]:
            self.shared_experts = mlp_cls(dict(a, F=moe["Fs"]))
            if moe["shared_gate"]:
                self.shared_experts.gate = _Vector(1, C)
        self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32), persistent=False)
        self.terms, self.kept_counts, self.bias_counts = {}, None, None
        self.global_aux, self.aux_map_counts = None, None  # global_aux_loss (StepStats.prepare)

    def forward(self, x):
        B, T, C = x.shape
        moe, E = self.moe, self.moe["E"]
        xs = x.reshape(B * T, C)                     # tptrain's token order: row b * S + s
        z = xs @ self.router.weight.t()              # (N, E) logits
        probs, routed = route(z, moe, self.expert_bias if moe["expert_bias"] else None)
        kept, cap = routed, None
        if moe["capacity"] is not None:
            probs, kept, cap = apply_capacity(probs, routed, moe["k"], moe["capacity"], moe["drop_policy"])
        y = torch.zeros_like(xs)
        for e in range(E):                           # padding to capacity: FLOPs only, not computed here
            rows = torch.nonzero(kept[:, e]).flatten()
            if rows.numel():
                y = y.index_add(0, rows, self.experts(e, xs[rows], probs[rows, e:e + 1]))
        if moe["Fs"]:
            sh = self.shared_experts(xs)
            if moe["shared_gate"]:
                sh = sh * torch.sigmoid(xs @ self.shared_experts.gate.weight.t())
            y = y + sh
        self.terms = balancing_losses(z.reshape(B, T, E), moe, self.global_aux)
        if moe["aux"] == "global_aux_loss":  # the plain top-k map's counts, for StepStats.prepare
            self.aux_map_counts = aux_scores(z.detach(), moe)[1].sum(0).to(torch.float64)
        self.kept_counts = kept.sum(0).to(torch.float64)
        # Megatron counts the routing map after token dropping for the bias, padded when padding
        self.bias_counts = torch.full((E,), float(min(cap, T * B)), dtype=torch.float64) \
            if moe["pad"] else self.kept_counts
        return y.reshape(B, T, C)


# ----------------------------------------------------------------------------------------------
# The training step's bookkeeping (gpt_ref.train_step): the objective's extra terms per micro-batch,
# the logged means, the expert bias update once per global batch.

class StepStats:
    """Accumulates the MoE layers' values over one iteration's micro-batches."""

    def __init__(self, layers):
        self.layers = layers
        self.sums, self.count = {}, 0
        self.global_sums, self.global_steps = [None] * len(layers), 0
        self.routed = [torch.zeros(lyr.moe["E"], dtype=torch.float64) for lyr in layers]
        self.bias = [torch.zeros(lyr.moe["E"], dtype=torch.float64) for lyr in layers]

    def prepare(self, i, n, forward):
        """Before micro-batch i of the step's n (forward(j) runs micro-batch j): for global_aux_loss,
        at the first of each DP group -- micro-batches i .. i + DP - 1 are the DP ranks' micro-batch
        i / DP, which Megatron's counts are summed over (with TP and CP: whole micro-batches here) --
        count the group's routing with a forward without gradients (the same routing), add it to
        the step's sums and give each layer the mean so far (Megatron's global_tokens_per_expert /
        ga_steps) for the group's micro-batches."""
        glob = [j for j, lyr in enumerate(self.layers) if lyr.moe["aux"] == "global_aux_loss"]
        if not glob:
            return
        dp = self.layers[glob[0]].moe["dp"]
        if n % dp:
            raise ValueError(f"{n} micro-batches per step are not DP = {dp} groups")
        if i % dp:
            return
        counts, tokens = [0.0] * len(self.layers), 0
        with torch.no_grad():
            for lyr in self.layers:
                lyr.global_aux = None
            for j in range(i, i + dp):
                forward(j)
                for g in glob:
                    counts[g] = counts[g] + self.layers[g].aux_map_counts
                tokens = float(self.layers[glob[0]].aux_map_counts.sum()) / self.layers[glob[0]].moe["k"] + tokens
        self.global_steps += 1
        for g in glob:
            self.global_sums[g] = counts[g] if self.global_sums[g] is None else self.global_sums[g] + counts[g]
            self.layers[g].global_aux = (self.global_sums[g] / self.global_steps, tokens, dp)

    def objective_terms(self):
        """After a micro-batch's forward: sum over MoE layers of (aux + z), as it enters the objective;
        records the logged values."""
        self.count += 1
        total = 0.0
        for i, lyr in enumerate(self.layers):
            for name, (term, logged) in lyr.terms.items():
                total = total + term
                self.sums[name] = self.sums.get(name, 0.0) + logged
            self.routed[i] += lyr.kept_counts
            self.bias[i] += lyr.bias_counts
        return total

    def finish(self):
        """The logged values (means over MoE layers and micro-batches; moe_max_imbalance), then the
        expert bias update bias += rate * sign(mean_e(count) - count)."""
        for lyr in self.layers:
            lyr.global_aux = None
        out = {n: v / (self.count * len(self.layers)) for n, v in self.sums.items()}
        out["moe_max_imbalance"] = max(float(r.max() / r.mean()) if r.sum() > 0 else 0.0 for r in self.routed)
        for lyr, counts in zip(self.layers, self.bias):
            if lyr.moe["expert_bias"]:
                step = torch.sign(counts.mean() - counts) * lyr.moe["bias_rate"]
                lyr.expert_bias += step.to(torch.float32)
        return out
