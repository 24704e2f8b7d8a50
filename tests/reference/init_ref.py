"""tptrain's counter-based initialisation for the PyTorch reference (gpt_ref.py), written from the
contract (docs/ARCHITECTURE.md "Numerics", core/rng.h's comments), vectorised in numpy:

  element e (flat row-major index in the parameter's GLOBAL shape) of a Normal-initialised tensor
  NAME = float32(std) * normal_at(seed, stream_id(NAME), e), where
    stream_id  = FNV-1a 64-bit of the name's bytes,
    normal_at  = Box-Muller in double on Philox4x32-10(counter_hi = stream, counter_lo = e, key = seed),
                 u1 = uniform_open0(r0, r1), u2 = uniform_open0(r2, r3), rounded to float32.
  std = init_method_std for wte, wpe, lm_head, attn.qkv.weight, mlp.fc1.weight and the MoE tensors
  (docs/MOE.md "Parameters": mlp.router.weight, mlp.experts.fc1.weight, mlp.shared_experts.fc1.weight,
  mlp.shared_experts.gate.weight); the output projections (attn.proj.weight, mlp.fc2.weight,
  mlp.experts.fc2.weight, mlp.shared_experts.fc2.weight) std / sqrt(2 num_layers) (float32
  arithmetic); norm weights 1 (the q/k norms' too), biases 0. An expert tensor's index is the flat index in its global
  (E, ...) shape, so expert j's weights do not depend on how the experts are split.
"""
import numpy as np

MASK32 = np.uint64(0xFFFFFFFF)
PHILOX_M0, PHILOX_M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
FNV_OFFSET, FNV_PRIME = 1469598103934665603, 1099511628211


def stream_id(name):
    """FNV-1a 64-bit of the UTF-8 bytes of name."""
    h = FNV_OFFSET
    for ch in name.encode("utf-8"):
        h ^= ch
        h = (h * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def philox4x32_10(counter_hi, counter_lo, key):
    """Philox4x32-10 on the 128-bit counter (c0, c1, c2, c3) = (lo32(counter_lo), hi32(counter_lo),
    lo32(counter_hi), hi32(counter_hi)) with key (k0, k1) = (lo32(key), hi32(key)) -- core/rng.h's
    argument mapping. counter_lo: numpy uint64 array (or int); counter_hi, key: ints.
    Returns the four 32-bit output words as uint64 arrays."""
    lo = np.asarray(counter_lo, dtype=np.uint64)
    hi = np.uint64(counter_hi & 0xFFFFFFFFFFFFFFFF)
    c0, c1 = lo & MASK32, lo >> np.uint64(32)
    c2 = np.full(lo.shape, hi & MASK32, dtype=np.uint64)
    c3 = np.full(lo.shape, hi >> np.uint64(32), dtype=np.uint64)
    k0, k1 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
    for _ in range(10):
        p0 = PHILOX_M0 * c0                 # 32 x 32 -> 64 bits: exact in uint64
        p1 = PHILOX_M1 * c2
        n0 = (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0)
        n2 = (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1)
        c1, c3 = p1 & MASK32, p0 & MASK32
        c0, c2 = n0, n2
        k0, k1 = (k0 + PHILOX_W0) & 0xFFFFFFFF, (k1 + PHILOX_W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


def uniform_open0(a, b):
    """Uniform in (0, 1] from the 53 bits (a << 21) ^ (b >> 11)."""
    x = ((a << np.uint64(21)) ^ (b >> np.uint64(11))) & np.uint64((1 << 53) - 1)
    return (x.astype(np.float64) + 1.0) * (1.0 / 9007199254740992.0)


def normal_at(seed, stream, index):
    """Standard normals (float32) for the indices (uint64 array) of one stream."""
    r0, r1, r2, r3 = philox4x32_10(stream, index, seed)
    u1 = uniform_open0(r0, r1)
    u2 = uniform_open0(r2, r3)
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586476925 * u2)).astype(np.float32)


NORM_WEIGHTS = ("ln_1.weight", "ln_2.weight", "ln_f.weight", "q_layernorm.weight", "k_layernorm.weight")
OUTPUT_PROJECTIONS = ("attn.proj.weight", "mlp.fc2.weight", "experts.fc2.weight")  # + shared_experts.fc2


def init_tensor(name, shape, seed, init_method_std, num_layers):
    """The float32 initial value of tptrain's parameter NAME of global shape SHAPE."""
    if name.endswith(NORM_WEIGHTS):
        return np.ones(shape, np.float32)
    if name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    std = np.float32(init_method_std)
    if name.endswith(OUTPUT_PROJECTIONS):
        std = np.float32(std / np.sqrt(np.float32(2.0) * np.float32(num_layers)))
    n = int(np.prod(shape))
    return (std * normal_at(seed, stream_id(name), np.arange(n, dtype=np.uint64))).reshape(shape)
