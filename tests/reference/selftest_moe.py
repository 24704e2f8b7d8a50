"""Self-checks of the Mixture-of-Experts reference (moe_ref.py): E = 1, k = 1 is the dense MLP;
gradcheck of the layer with its balancing losses for every router option; hand-computed aux,
seq-aux and z losses; capacity dropping by both policies; group-limited routing; the expert bias
update; the CLI on a tiny MoE GPT. Registered into selftest.py's checks on import; run them with
`selftest.py --only moe`."""
import json
import math
import os

import numpy as np
import torch

import gpt_ref
import moe_ref
from selftest_common import check, cli, tiny_cfg

BASE = {"num_moe_experts": 4, "moe_ffn_hidden_size": 6, "moe_router_topk": 2}
# each router option alone (and some together) on a 4- or 6-expert layer
OPTIONS = {
    "softmax": {},
    "pre_softmax": {"moe_router_pre_softmax": True},
    "sigmoid": {"moe_router_score_function": "sigmoid"},
    "sigmoid_k1": {"moe_router_score_function": "sigmoid", "moe_router_topk": 1},
    "scaling": {"moe_router_topk_scaling_factor": 2.5},
    "groups": {"num_moe_experts": 6, "moe_router_num_groups": 3, "moe_router_group_topk": 2},
    "groups_pre_softmax": {"num_moe_experts": 6, "moe_router_num_groups": 3, "moe_router_group_topk": 1,
                           "moe_router_pre_softmax": True},
    "expert_bias": {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True},
    "capacity_probs": {"moe_expert_capacity_factor": 0.6},
    "capacity_position": {"moe_expert_capacity_factor": 0.6, "moe_token_drop_policy": "position"},
    "capacity_pad": {"moe_expert_capacity_factor": 0.6, "moe_pad_expert_input_to_capacity": True},
    "seq_aux": {"moe_router_load_balancing_type": "seq_aux_loss"},
    "shared_gate": {"moe_shared_expert_intermediate_size": 5, "moe_shared_expert_gate": True},
    "swiglu_shared": {"swiglu": True, "moe_shared_expert_intermediate_size": 5, "add_bias_linear": False},
}


def moe_cfg(extra, L=2):
    m = tiny_cfg(L=L, C=8, H=2, V=11, P=6, Fh=12)
    m.update({"init_method_std": 0.02, "moe_aux_loss_coeff": 0.1, "moe_z_loss_coeff": 0.01})
    m.update(BASE)
    m.update(extra)
    return m


def layer_of(m, seed=0):
    """A float64 MoE layer of config m with random weights (std 0.4, biases too)."""
    layer = gpt_ref.build_model(m, torch.float64).moe_layers()[0]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        if layer.moe["expert_bias"]:
            layer.expert_bias.copy_(0.05 * torch.randn(layer.moe["E"], generator=g, dtype=torch.float64))
    return layer


def decision_margin(layer, x):
    """The smallest gap behind a discrete choice of the layer on x: between a token's k-th and
    (k+1)-th candidate (after the group choice, whose own gap counts too), and between the
    probabilities capacity compares. Finite differences must not cross one."""
    moe = layer.moe
    N = x.shape[0] * x.shape[1]
    xs = x.detach().transpose(0, 1).reshape(N, -1)
    z = xs @ layer.router.weight.detach().t()
    if moe["score"] == "softmax":
        s = torch.softmax(z, -1) if moe["pre_softmax"] else z
    else:
        s = torch.sigmoid(z) + (layer.expert_bias if moe["expert_bias"] else 0)
    gaps = []
    k, E = moe["k"], moe["E"]
    if moe["group_topk"]:
        G, Gk = moe["groups"], moe["group_topk"]
        sums = s.reshape(N, G, E // G).sort(-1, descending=True).values[..., :k // Gk].sum(-1)   # (N, G)
        ordered = sums.sort(-1, descending=True).values
        gaps.append((ordered[:, Gk - 1] - ordered[:, Gk]).min())
        keep = torch.zeros(N, G, dtype=torch.bool).scatter(1, moe_ref.topk_lower_index(sums, Gk)[1], True)
        s = s.masked_fill(~keep.repeat_interleave(E // G, 1), -1e9)
    ss = s.sort(-1, descending=True).values
    if k < E:
        gaps.append((ss[:, k - 1] - ss[:, k]).min())
    aux = moe_ref.aux_scores(z, moe)[0].sort(-1, descending=True).values
    if k < E:
        gaps.append((aux[:, k - 1] - aux[:, k]).min())
    if moe["capacity"] is not None:
        probs, routed = moe_ref.route(z, moe, layer.expert_bias if moe["expert_bias"] else None)
        for e in range(E):
            v = probs[routed[:, e], e].sort().values
            if v.numel() > 1:
                gaps.append((v[1:] - v[:-1]).min())
    return float(min(gaps))


@check
def gradcheck_moe_layer_every_router_option():
    """torch.autograd.gradcheck (float64) of the layer's output, aux (or seq aux) loss and z-loss in
    the input and every parameter, for each router option, on inputs whose discrete choices are at
    least 1e-3 from a tie (the first such seed)."""
    done = []
    for name, extra in OPTIONS.items():
        m = moe_cfg(extra)
        for seed in range(50):
            layer = layer_of(m, seed)
            x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64)
            margin = decision_margin(layer, x)
            if margin > 1e-3:
                break
        else:
            return False, f"{name}: no seed of 50 keeps the routing 1e-3 from a tie"
        names = [n for n, _ in layer.named_parameters()]
        params = [p.detach().clone().requires_grad_(True) for _, p in layer.named_parameters()]
        w = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(7), dtype=torch.float64)

        def f(xi, *ps):
            y = torch.nn.utils.stateless.functional_call(layer, dict(zip(names, ps)), (xi,))
            losses = [t for t, _ in layer.terms.values()]
            return (y * w).sum(), sum(losses)

        xi = x.clone().requires_grad_(True)
        f(xi, *params)
        if len(layer.terms) != 2:
            return False, f"{name}: terms {sorted(layer.terms)}, expected an aux loss and the z-loss"
        if not torch.autograd.gradcheck(f, (xi, *params), eps=1e-6, atol=1e-6, rtol=1e-5):
            return False, f"{name}: gradcheck failed"
        dropped = ""
        if layer.moe["capacity"] is not None:
            kept = int(layer.kept_counts.sum())
            dropped = f" ({10 * layer.moe['k'] - kept} of {10 * layer.moe['k']} dropped)"
            if kept == 10 * layer.moe["k"]:
                return False, f"{name}: capacity dropped nothing"
        done.append(f"{name}{dropped} [margin {margin:.0e}]")
    return True, "gradcheck passed: " + ", ".join(done)


@check
def moe_one_expert_is_the_dense_mlp():
    """E = 1, k = 1 (softmax over one logit: probability 1) with the dense MLP's weights as the
    expert's: the same GPT loss and gradients as the dense model (GELU and SwiGLU)."""
    out = []
    for swiglu in (False, True):
        dense_m = tiny_cfg(L=2, C=8, H=2, V=11, P=6, Fh=12)
        dense_m.update({"swiglu": swiglu})
        moe_m = dict(dense_m, num_moe_experts=1, moe_router_topk=1, moe_router_load_balancing_type="none")
        dense, moe = gpt_ref.build_model(dense_m, torch.float64), gpt_ref.build_model(moe_m, torch.float64)
        g = torch.Generator().manual_seed(3)
        state = {n: 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64) for n, p in dense.named_parameters()}
        dense.load_state({n: v.numpy() for n, v in state.items()})
        mstate = {}
        for n, p in moe.named_parameters():
            src = n.replace("mlp.experts.", "mlp.")
            mstate[n] = (state[src][None] if "experts" in n else state[src]).numpy() if src in state else \
                (0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64)).numpy()
        moe.load_state(mstate)
        tokens = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(4))
        ld, lm = dense.loss(tokens), moe.loss(tokens)
        gd = dict(zip([n for n, _ in dense.named_parameters()], torch.autograd.grad(ld, list(dense.parameters()))))
        gm = dict(zip([n for n, _ in moe.named_parameters()], torch.autograd.grad(lm, list(moe.parameters()))))
        err = max(float((gm[n] - (gd[n.replace("mlp.experts.", "mlp.")][None] if "experts" in n else gd[n])).abs().max())
                  for n in gm if "router" not in n)
        router = max(float(gm[n].abs().max()) for n in gm if "router" in n)
        if abs(float(ld - lm)) > 1e-12 or err > 1e-12 or router != 0.0:
            return False, f"swiglu={swiglu}: |d loss| {abs(float(ld - lm)):.1e}, max |d grad| {err:.1e}, router grad {router}"
        out.append(f"swiglu={swiglu}: |d loss| {abs(float(ld - lm)):.0e}, max |d grad| {err:.0e}")
    return True, "; ".join(out) + "; router gradient exactly 0"


@check
def moe_hand_computed_balancing_losses():
    """aux_loss, seq_aux_loss and the z-loss of a 2 x 3 token, 3-expert, k = 2 logits matrix, by hand
    (python floats): softmax scores, plain top-2 counts f, column sums P, coeff E/(k T^2) sum f P;
    per sequence with T = 3 averaged over the 2 sequences; mean logsumexp^2. Sigmoid scores too."""
    zb = [[[1.0, 0.0, -1.0], [0.5, 2.0, 0.1], [-0.3, 0.2, 0.4]],
          [[2.0, -1.0, 0.3], [0.0, 0.7, 1.5], [1.1, 1.2, -2.0]]]
    lines = []
    for score in ("softmax", "sigmoid"):
        def scores(row):
            if score == "softmax":
                ex = [math.exp(v) for v in row]
            else:
                ex = [1.0 / (1.0 + math.exp(-v)) for v in row]
            return [v / sum(ex) for v in ex]

        def aux_of(rows):
            T, f, P = len(rows), [0, 0, 0], [0.0, 0.0, 0.0]
            for row in rows:
                s = scores(row)
                for e in sorted(range(3), key=lambda e: -s[e])[:2]:
                    f[e] += 1
                for e in range(3):
                    P[e] += s[e]
            return 3 / (2 * T * T) * sum(fe * pe for fe, pe in zip(f, P))
        hand_aux = aux_of(zb[0] + zb[1])
        hand_seq = (aux_of(zb[0]) + aux_of(zb[1])) / 2
        hand_z = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for r in zb for row in r) / 6
        z = torch.tensor(zb, dtype=torch.float64)
        got = {}
        for lb in ("aux_loss", "seq_aux_loss"):
            moe = {"E": 3, "k": 2, "score": score, "aux": lb, "aux_coeff": 0.5, "z_coeff": 0.25}
            out = moe_ref.balancing_losses(z, moe)
            got.update(out)
        err = max(abs(got["load_balancing_loss"][1] - hand_aux), abs(got["load_balancing_loss"][0] - 0.5 * hand_aux),
                  abs(got["seq_load_balancing_loss"][1] - hand_seq), abs(got["z_loss"][1] - hand_z),
                  abs(float(got["z_loss"][0]) - 0.25 * hand_z))
        if err > 1e-14:
            return False, f"{score}: max |reference - hand| {err:.1e}"
        lines.append(f"{score}: aux {hand_aux:.6f}, seq aux {hand_seq:.6f}, z {hand_z:.6f}")
    return True, "; ".join(lines) + " (|d| <= 1e-14)"


@check
def moe_capacity_dropping_by_hand():
    """6 tokens, 2 experts, k = 1, factor 1: capacity ceil(6 / 2) = 3. Expert 0 is routed tokens 0, 1,
    2, 4, 5. Probabilities .9 .5 .7 .5 .8: policy probs keeps tokens 0, 2, 5 (drops the two .5);
    probabilities .9 .6 .3 .6 .8: keeps 0, 5 and of the tied .6 the earlier token 1; position keeps
    tokens 0, 1, 2 either way. Expert 1 (token 3 only) drops nothing. The capacity formula on 64
    tokens; pad_to_capacity counts min(capacity, N) for every expert (the expert bias's counts)."""
    routed = torch.tensor([[1, 0], [1, 0], [1, 0], [0, 1], [1, 0], [1, 0]], dtype=torch.bool)
    cases = []
    p1 = torch.tensor([[.9, 0], [.5, 0], [.7, 0], [0, 1.], [.5, 0], [.8, 0]], dtype=torch.float64)
    p2 = torch.tensor([[.9, 0], [.6, 0], [.3, 0], [0, 1.], [.6, 0], [.8, 0]], dtype=torch.float64)  # tie at the edge
    want = {("probs", 1): [0, 2, 5], ("position", 1): [0, 1, 2], ("probs", 2): [0, 1, 5], ("position", 2): [0, 1, 2]}
    for (policy, which), rows in want.items():
        p = p1 if which == 1 else p2
        probs, kept, cap = moe_ref.apply_capacity(p, routed, 1, 1.0, policy)
        got = torch.nonzero(kept[:, 0]).flatten().tolist()
        if cap != 3 or got != rows or kept[:, 1].tolist() != routed[:, 1].tolist() or \
                not torch.equal(probs, p * kept):
            return False, f"{policy} case {which}: kept {got} (want {rows}), capacity {cap}"
        cases.append(f"{policy}/{which}: keeps {got}")
    # the capacity formula: ceil(N k / E * factor), and no dropping at capacity >= N
    caps = [moe_ref.expert_capacity(64, 4, 2, f) for f in (0.8, 1.0, 1.3)]
    if caps != [26, 32, 42]:
        return False, f"capacities {caps}"
    m = moe_cfg({"moe_expert_capacity_factor": 0.5, "moe_pad_expert_input_to_capacity": True,
                 "moe_router_topk": 1, "num_moe_experts": 2})
    layer = layer_of(m)
    layer(torch.randn(2, 6, 8, dtype=torch.float64))
    if layer.bias_counts.tolist() != [3.0, 3.0] or layer.kept_counts.sum() > 6:
        return False, f"pad: bias counts {layer.bias_counts.tolist()}, kept {layer.kept_counts.tolist()}"
    return True, "; ".join(cases) + f"; capacities {caps}; pad counts capacity per expert"


@check
def moe_group_limited_routing_by_hand():
    """6 experts in 3 groups of 2, k = 2. Token 0's logits [3, -5, 2, 2, 0, 0]: group sums of the top 1
    (group_topk 2) are 3, 2, 0 -> groups 0, 1 -> experts 0 and 2 (2 ties 3: the lower index); with
    group_topk 1 (sums of the top 2: -2, 4, 0) only group 1 -> experts 2, 3, though expert 0 is the
    largest. Token 1 [0, 0, 1, 1, 1, 1]: group_topk 1, tied groups 1 and 2 -> group 1."""
    z = torch.tensor([[3.0, -5.0, 2.0, 2.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    got2 = moe_ref.select_experts(z, 2, 3, 2).tolist()
    got1 = moe_ref.select_experts(z, 2, 3, 1).tolist()
    plain = moe_ref.select_experts(z, 2).tolist()
    ok = got2[0] == [0, 2] and got1 == [[2, 3], [2, 3]] and plain[0] == [0, 2] and plain[1] == [2, 3]
    moe = {"k": 2, "groups": 3, "group_topk": 1, "score": "softmax", "pre_softmax": False, "scaling": None}
    probs, routed = moe_ref.route(z, moe)
    p0 = math.exp(2.0) / (2 * math.exp(2.0))
    ok = ok and abs(float(probs[0, 2]) - p0) < 1e-15 and routed[0].tolist() == [False, False, True, True, False, False]
    return ok, f"group_topk 2: {got2}; group_topk 1: {got1}; ungrouped {plain}; probs over the chosen two 0.5"


@check
def moe_expert_bias_update_and_logged_values(work):
    """Through the CLI on a tiny sigmoid MoE GPT with the expert bias and every logged value: the
    metrics carry load_balancing_loss, z_loss and moe_max_imbalance, the bias moves by exactly
    rate * sign(mean - count) per step, global_aux_loss and bad MoE keys exit 2 naming the key."""
    import make_tokens
    prefix = os.path.join(work, "moe_tokens")
    make_tokens.main(["--vocab", "11", "--tokens", "400", "--docs", "3", "--pattern", "markov",
                      "--seed", "2", "--megatron", prefix])
    cfg = os.path.join(work, "moe.yaml")
    m = moe_cfg({"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                 "moe_router_bias_update_rate": 0.01, "moe_layer_freq": [0, 1]})
    import yaml
    with open(cfg, "w") as f:
        yaml.safe_dump({"model": m, "training": {"micro_batch_size": 2, "global_batch_size": 4,
                                                 "train_iters": 3, "precision": "fp32"},
                        "optimizer": {"lr": 1e-3, "min_lr": 0.0, "lr_warmup_iters": 0,
                                      "lr_decay_style": "constant", "weight_decay": 0.0, "adam_beta1": 0.9,
                                      "adam_beta2": 0.95, "adam_eps": 1e-8, "clip_grad": 1.0},
                        "data": {"path": prefix, "shuffle": False, "split": [1, 0, 0]}}, f)
    out = os.path.join(work, "moe.jsonl")
    rc, err = cli(["--config", cfg, "--out", out])
    if rc != 0:
        return False, f"gpt_ref failed: {err}"
    recs = [json.loads(line) for line in open(out)]
    keys = set(recs[0]) - {"iteration", "consumed_samples", "lm_loss", "grad_norm", "lr"}
    if keys != {"load_balancing_loss", "z_loss", "moe_max_imbalance"}:
        return False, f"logged MoE keys {sorted(keys)}"
    # the bias: replay 3 steps in-process and check each update is +-rate or 0
    cfg_d = gpt_ref.load_config(cfg, [])
    model = gpt_ref.run_training(cfg_d, None, 3, None, log=open(os.devnull, "w"))
    bias = model.moe_layers()[0].expert_bias
    steps = np.round(bias.numpy() / 0.01, 4)
    if len(model.moe_layers()) != 1 or not np.all(np.abs(steps) <= 3) or not np.allclose(steps, np.round(steps)):
        return False, f"expert bias after 3 steps {bias.tolist()} is not a sum of 3 steps of +-0.01"
    bad = {"global_aux_loss": ("model.moe_router_load_balancing_type=global_aux_loss", "global_aux_loss"),
           "topk": ("model.moe_router_topk=5", "moe_router_topk"),
           "groups": ("model.moe_router_num_groups=3", "moe_router_num_groups"),
           "bias_softmax": ("model.moe_router_score_function=softmax", "moe_router_enable_expert_bias"),
           "freq": ("model.moe_layer_freq=[1]", "moe_layer_freq"),
           "etp": ("parallel.expert_tensor_parallel_size=2", "expert_tensor_parallel_size")}
    for name, (setting, word) in bad.items():
        rc_b, err_b = cli(["--config", cfg, "--out", os.devnull, "--set", setting])
        if rc_b != 2 or word not in err_b:
            return False, f"{name}: {setting} gave exit {rc_b}: {err_b.strip()[-200:]}"
    return True, (f"3 steps: lm loss {recs[0]['lm_loss']:.4f} -> {recs[-1]['lm_loss']:.4f}, load_balancing_loss "
                  f"{recs[0]['load_balancing_loss']:.4f}, z_loss {recs[0]['z_loss']:.4f}, imbalance "
                  f"{recs[0]['moe_max_imbalance']:.3f}; expert bias / rate {steps.tolist()}; {len(bad)} bad configs exit 2")
