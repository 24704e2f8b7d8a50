"""FP8 training in the PyTorch reference (docs/FP8.md "GEMM path"), emulated: the CI's torch (1.13)
has no float8 dtypes, so each GEMM input is quantized to the E4M3 / E5M2 grid and decoded in float64
with fp8_ref.py's numerics, vectorised: clamp to +-max (inf too), the quantum 2^(max(floor(log2 |x|),
1 - bias) - mantissa bits), round half to even (torch.round), the sign kept (signed zeros), NaN stays
NaN. Independent of core/fp8.h and of tptrain's code.

Blockwise scaling (fp8_recipe: blockwise): block_qdq / Fp8BlockLinearFn below. Delayed scaling
(fp8_recipe: delayed): DelayedScale below. Current scaling (training.fp8_recipe: tensorwise), per GEMM
call and tensor:
  amax = max |x| over the whole tensor (a micro-batch's activations or output gradients, the whole
  weight: what tptrain's amax reduction over TP and CP makes of its parts),
  scale = (fp8_max / amax) / 2^margin in fp32 (FLT_MAX if that overflows; amax 0 / inf / nan: 1),
  x is read as decode(q(fp32(x * scale))) * fp32(1 / scale) (fp32 products).
MoE layers (moe_ref.MoEMLP): attn.qkv and attn.proj as above; the shared expert's fc1 and fc2 as a dense
MLP's (every token of the micro-batch); each routed expert's fc1 and fc2 per micro-batch on that
expert's rows (token order; an expert without rows quantizes nothing), with its own delayed-scaling
state per expert and GEMM; the router and the shared expert's gate stay unquantized.
The GEMMs of attn.qkv, attn.proj, mlp.fc1 and mlp.fc2 of the FP8 layers:
  forward  y  = dq(x) @ dq(W)^T + b
  backward dx = dq(dy) @ dq(W),  dW = dq(dy)^T @ dq(x) (fp8_wgrad: false -> dy^T @ x),  db = sum dy
with dy quantized to E5M2 under fp8_format: hybrid, E4M3 under e4m3. Everything else in fp32 (the
reference computes in fp32 whatever training.precision says), except that with training.precision:
bf16 each GEMM input (activation, weight, output gradient) is rounded to bf16 before it is quantized,
as tptrain's bf16 run stores them: the same rounding of nearly the same values, so the FP8 codes of
the two differ only where their bf16 values do."""
import numpy as np
import torch
import torch.nn.functional as F

FORMATS = {"e4m3": (3, 7, 448.0), "e5m2": (2, 15, 57344.0)}  # mantissa bits, bias, max (fp8_ref.py)
FLT_MAX = float(np.finfo(np.float32).max)


def scale_from_amax(amax, fmt, margin, previous=np.float32(1.0)):
    """fp8_ref.py's scale_from_amax (previous: 1 for a tensor's own scale, delayed: the last one)."""
    amax = np.float32(amax)
    if not (amax > 0) or not np.isfinite(amax):
        return np.float32(previous)
    with np.errstate(over="ignore", divide="ignore"):
        s = (np.float32(FORMATS[fmt][2]) / amax) / np.float32(2.0 ** margin)
    return np.float32(FLT_MAX) if np.isinf(s) else s


def fp8_grid(y, fmt):
    """The fp8 value (float64) of each fp32 element of y: nearest even, saturated, NaN kept."""
    M, B, mx = FORMATS[fmt]
    y = y.double()
    a = y.abs().clamp(max=mx)
    _, e = torch.frexp(a)                         # a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1
    e = torch.clamp(e - 1, min=1 - B)
    q = torch.ldexp(torch.ones_like(a), e - M)    # the quantum, a power of two: a / q is exact
    r = torch.round(a / q) * q                    # half to even
    r = torch.copysign(r, y)                      # signed zeros kept
    return torch.where(torch.isnan(y), y, r)


def nan_max(a, b):
    """max of two amaxes, a NaN winning (tptrain compares the bits of |x|)."""
    return np.float32("nan") if np.isnan(a) or np.isnan(b) else np.float32(max(a, b))


class DelayedScale:
    """Delayed scaling of one GEMM input (Transformer Engine's order, docs/FP8.md): quantize with the
    scale of the last update, keep the step's amax (max over its quantizations); after the step
    (update) the amax goes into history[0], the scale comes from max(history) or history[0] (an amax
    of 0 / inf / nan keeps the scale), the history rolls by one (numpy.roll(h, -1)) and history[0] is
    zeroed."""

    def __init__(self, fmt, margin, history_len, algo_max):
        self.fmt, self.margin, self.algo_max = fmt, margin, algo_max
        self.scale = np.float32(1.0)
        self.history = np.zeros(history_len, dtype=np.float32)
        self.step_amax = np.float32(0.0)

    def update(self):
        self.history[0] = nan_max(self.history[0], self.step_amax)
        amax = self.history[0]
        if self.algo_max:
            amax = np.float32("nan") if np.isnan(self.history).any() else self.history.max()
        self.scale = scale_from_amax(amax, self.fmt, self.margin, self.scale)
        self.history = np.roll(self.history, -1)
        self.history[0] = 0.0
        self.step_amax = np.float32(0.0)


def qdq(x, fmt, margin, bf16=False, state=None):
    """x (fp32) as the FP8 GEMM reads it: decode(q(x * scale)) * scale_inv, fp32. bf16: x is first
    rounded to bf16 (nearest even), as a bf16 run stores every GEMM input. The scale: x's own amax's
    (current scaling), or with a DelayedScale its scale (x's amax recorded for its update)."""
    x = x.detach().float()
    if bf16:
        x = x.to(torch.bfloat16).float()
    amax = x.abs().max()
    amax = np.float32("nan") if torch.isnan(amax) else np.float32(float(amax))
    if state is not None:
        state.step_amax = nan_max(state.step_amax, amax)
        s = state.scale
    else:
        s = scale_from_amax(amax, fmt, margin)
    s_inv = np.float32(1.0) / s
    y = x * torch.tensor(s, dtype=torch.float32)  # fp32 product
    return fp8_grid(y, fmt).float() * torch.tensor(s_inv, dtype=torch.float32)


def block_qdq(x, fmt, margin, bf16, br, bc):
    """Blockwise scaling (docs/FP8.md): x (rows, cols) in blocks of (br, bc), the edges' cut; each block
    quantized with its own scale: scale_from_amax of its amax, truncated to a power of two (the fp32
    mantissa bits zeroed), and read back times 1 / scale. Vectorised: x zero-padded to whole blocks
    (a zero changes no amax)."""
    x = x.detach().float()
    if bf16:
        x = x.to(torch.bfloat16).float()
    rows, cols = x.shape
    R, C = -(-rows // br) * br, -(-cols // bc) * bc
    xp = torch.zeros(R, C, dtype=torch.float32)
    xp[:rows, :cols] = x
    blocks = xp.reshape(R // br, br, C // bc, bc)
    amax = blocks.abs().amax(dim=(1, 3)).numpy().astype(np.float32)
    amax[np.isnan(blocks.numpy()).any(axis=(1, 3))] = np.float32("nan")
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        sc = (np.float32(FORMATS[fmt][2]) / amax) / np.float32(2.0 ** margin)
    sc = np.where(np.isinf(sc), np.float32(FLT_MAX), sc).astype(np.float32)
    sc = np.where((amax > 0) & np.isfinite(amax), sc, np.float32(1.0)).astype(np.float32)
    sc = (sc.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    inv = (np.float32(1.0) / sc).astype(np.float32)
    s_t, inv_t = torch.from_numpy(sc)[:, None, :, None], torch.from_numpy(inv)[:, None, :, None]
    q = fp8_grid(blocks * s_t, fmt).float() * inv_t  # fp32 products, as the quantization and the decoding
    return q.reshape(R, C)[:rows, :cols]


class Fp8BlockLinearFn(torch.autograd.Function):
    """The blockwise recipe's GEMMs: x 1 x 128 and W 128 x 128 forward; dY 1 x 128 with W for dx; dY and
    x 128 x 1 (along the tokens) for dW."""
    @staticmethod
    def forward(ctx, x, w, b, opts):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        m, bf = opts["margin"], opts["bf16"]
        wq = block_qdq(w, "e4m3", m, bf, 128, 128)
        ctx.save_for_backward(x2, w, wq)
        ctx.opts, ctx.has_bias, ctx.shape = opts, b is not None, shape
        y = block_qdq(x2, "e4m3", m, bf, 1, 128) @ wq.t()
        if b is not None:
            y = y + b
        return y.reshape(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, w, wq = ctx.saved_tensors
        o = ctx.opts
        m, bf, f = o["margin"], o["bf16"], o["dy_format"]
        dy2 = dy.reshape(-1, w.shape[0]).float()
        dx = (block_qdq(dy2, f, m, bf, 1, 128) @ wq).reshape(ctx.shape)
        if o["wgrad"]:
            dw = block_qdq(dy2, f, m, bf, 128, 1).t() @ block_qdq(x2, "e4m3", m, bf, 128, 1)
        else:
            r = (lambda t: t.to(torch.bfloat16).float()) if bf else (lambda t: t)
            dw = r(dy2).t() @ r(x2)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx, dw, db, None


class Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, opts):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        st = opts.get("states") or (None, None, None)  # delayed: the input's, the weight's, the gradient's
        xq, wq = qdq(x2, "e4m3", opts["margin"], opts["bf16"], st[0]), qdq(w, "e4m3", opts["margin"], opts["bf16"], st[1])
        ctx.save_for_backward(x2, w, xq, wq)
        ctx.opts, ctx.has_bias, ctx.shape = opts, b is not None, shape
        y = xq @ wq.t()
        if b is not None:
            y = y + b
        return y.reshape(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x2, w, xq, wq = ctx.saved_tensors
        o = ctx.opts
        dy2 = dy.reshape(-1, w.shape[0]).float()
        dyq = qdq(dy2, o["dy_format"], o["margin"], o["bf16"], (o.get("states") or (None, None, None))[2])
        dx = (dyq @ wq).reshape(ctx.shape)
        if o["wgrad"]:
            dw = dyq.t() @ xq
        else:  # the GEMM on the (bf16-stored) unquantized inputs
            r = (lambda t: t.to(torch.bfloat16).float()) if o["bf16"] else (lambda t: t)
            dw = r(dy2).t() @ r(x2)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx, dw, db, None


def _fp8_forward(linear, opts):
    fn = Fp8BlockLinearFn if opts.get("blockwise") else Fp8LinearFn
    def forward(x):
        return fn.apply(x, linear.weight, linear.bias, opts)
    return forward


def enable_fp8(model, t):
    """Makes the FP8 layers' four linear GEMMs FP8 (training keys t); returns the FP8 layers' indices."""
    if t.get("fp8_format") is None:
        return []
    if t["fp8_recipe"] not in ("tensorwise", "delayed", "blockwise"):
        raise ValueError(f"unknown training.fp8_recipe {t['fp8_recipe']!r}")
    dy_format = "e5m2" if t["fp8_format"] == "hybrid" else "e4m3"
    opts = {"dy_format": dy_format, "wgrad": t["fp8_wgrad"], "margin": t["fp8_margin"],
            "bf16": t["precision"] == "bf16", "blockwise": t["fp8_recipe"] == "blockwise"}
    model.fp8_states = []
    L = len(model.h)
    begin, end = 0, L
    if t["first_last_layers_bf16"]:
        begin, end = t["num_layers_at_start_in_bf16"], L - t["num_layers_at_end_in_bf16"]
    def gemm_opts():  # one GEMM's options (delayed: its inputs' own states)
        o = dict(opts)
        if t["fp8_recipe"] == "delayed":
            o["states"] = tuple(DelayedScale(f, t["fp8_margin"], t["fp8_amax_history_len"],
                                             t["fp8_amax_compute_algo"] == "max")
                                for f in ("e4m3", "e4m3", dy_format))
            model.fp8_states.extend(o["states"])
        return o

    for i in range(begin, end):
        blk = model.h[i]
        mods = [blk.attn.qkv, blk.attn.proj]
        experts = getattr(blk.mlp, "experts", None)  # a MoE layer (moe_ref.MoEMLP)
        if experts is None:
            mods += [blk.mlp.fc1, blk.mlp.fc2]
        elif hasattr(blk.mlp, "shared_experts"):
            mods += [blk.mlp.shared_experts.fc1, blk.mlp.shared_experts.fc2]
        for lin in mods:
            lin.forward = _fp8_forward(lin, gemm_opts())
        if experts is not None:
            for lin in (experts.fc1, experts.fc2):
                lin.apply_one = _fp8_apply_one(lin, [gemm_opts() for _ in range(lin.weight.shape[0])])
    return list(range(begin, end))


def _fp8_apply_one(stacked, opts):
    """A MoE layer's stacked expert maps (moe_ref._Linear3): expert e's GEMM in FP8 with opts[e]."""
    def apply_one(e, x, bias=True):
        fn = Fp8BlockLinearFn if opts[e].get("blockwise") else Fp8LinearFn
        return fn.apply(x, stacked.weight[e], stacked.bias[e] if bias and hasattr(stacked, "bias") else None, opts[e])
    return apply_one


def end_step(model):
    """After a training step's backward: delayed scaling's update of every GEMM input (no-op otherwise)."""
    for st in getattr(model, "fp8_states", []):
        st.update()


def _selftest():
    """A few grid points against fp8_ref.py's scalar quantize (run: python3 fp8_train_ref.py)."""
    import math
    import fp8_ref
    rng = np.random.default_rng(3)
    for fmt in FORMATS:
        xs = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.uniform(-8, 6, 2000),
                             [0.0, -0.0, 1e30, -1e30, FORMATS[fmt][2] * 1.03]]).astype(np.float32)
        got = fp8_grid(torch.from_numpy(xs), fmt).numpy()
        for x, g in zip(xs.tolist(), got.tolist()):
            want = fp8_ref.decode(fp8_ref.quantize(x, fmt), fmt)
            assert g == want and math.copysign(1, g) == math.copysign(1, want), (fmt, x, g, want)
    print("fp8_train_ref: fp8_grid equals fp8_ref.quantize on 2005 values per format")


if __name__ == "__main__":
    _selftest()
