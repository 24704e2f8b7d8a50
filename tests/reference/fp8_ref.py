#!/usr/bin/env python3
"""FP8 quantization reference (docs/FP8.md), independent of core/fp8.h: writes the test vectors that
tests/unit/fp8_test.cpp compares with bitwise (tests/reference/fp8_ref.txt; tests/cli/fp8_ref.sh
checks that the committed file is what this script writes).

The rounding is computed in exact arithmetic: an fp32 input (held exactly in a Python float) is
clamped to +-max (as Transformer Engine's satfinite cast, and torch's float8 casts only after an
explicit clamp), divided by its quantum 2^(floor(log2|x|) - M) (or the subnormal quantum), rounded
half to even by Python's round(), and looked up in the table of all 256 codes decoded from the
format's definition. torch >= 2.1's float8_e4m3fn / float8_e5m2 casts give the same codes on these
inputs (the CI's torch 1.13 has no float8 dtypes, so this script does not need torch).

Scaling (Transformer Engine's delayed scaling, and current scaling from a tensor's own amax):
scale = (fp8_max / amax) / 2^margin in fp32, FLT_MAX if that overflows; amax 0, inf or nan keeps
the previous scale. Quantized = fp8(fp32(x * scale)).

Output lines:
  q FORMAT MARGIN PREV_SCALE AMAX SCALE n x1 c1 x2 c2 ...   (x as fp32 bit patterns in hex, c as hex codes)
  h FORMAT ALGO LEN MARGIN k amax1 ... amaxk ; scale1 ... scalek   (delayed: the scale after each update)
"""
import math
import random
import struct
import sys

import numpy as np

FORMATS = {"e4m3": (3, 7, 448.0), "e5m2": (2, 15, 57344.0)}  # mantissa bits, bias, max


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def decode(code, fmt):
    M, B, _ = FORMATS[fmt]
    E = 7 - M
    e, m = (code >> M) & ((1 << E) - 1), code & ((1 << M) - 1)
    s = -1.0 if code & 0x80 else 1.0
    if fmt == "e4m3" and e == 15 and m == 7:
        return math.nan
    if fmt == "e5m2" and e == 31:
        return s * math.inf if m == 0 else math.nan
    if e == 0:
        return s * m * 2.0 ** (1 - B - M)
    return s * (1 + m / 2.0**M) * 2.0 ** (e - B)


def table(fmt):
    t = {}
    for c in range(256):
        v = decode(c, fmt)
        if not math.isnan(v) and not math.isinf(v):
            t[(v, math.copysign(1.0, v))] = c
    return t


TABLES = {f: table(f) for f in FORMATS}


def quantize(x, fmt):
    M, B, mx = FORMATS[fmt]
    if math.isnan(x):
        return 0xFF if math.copysign(1.0, x) < 0 else 0x7F
    sign = math.copysign(1.0, x)
    a = min(abs(x), mx)  # the clamp to +-max (inf too)
    if a == 0:
        return TABLES[fmt][(0.0 * sign, sign)]
    e = max(math.frexp(a)[1] - 1, 1 - B)  # floor(log2 a), at least the smallest normal exponent
    q = 2.0 ** (e - M)
    r = round(a / q) * q  # a / q exact: a power-of-two division of a double
    return TABLES[fmt][(sign * r if r else 0.0 * sign, sign)]


def scale_from_amax(amax, prev, fmt, margin):
    if not (amax > 0) or math.isinf(amax) or math.isnan(amax):
        return prev
    with np.errstate(over="ignore"):
        s = (np.float32(FORMATS[fmt][2]) / np.float32(amax)) / np.float32(2.0**margin)
    return float(np.finfo(np.float32).max) if np.isinf(s) else float(s)


def amax_of(xs):
    return math.nan if any(math.isnan(x) for x in xs) else max(abs(x) for x in xs)


def inputs(rng, fmt):
    """(specials, ties: every midpoint between neighbouring codes and its fp32 neighbours, random)"""
    M, B, mx = FORMATS[fmt]
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, mx, -mx, f32(mx * 1.03), 1e30, -1e30,
                f32(2.0 ** (1 - B - M) / 2), f32(2.0 ** (1 - B - M) / 4), 1e-45, -1e-40]
    ties = [mx]
    for c in range(1, 0x7F):
        lo, hi = decode(c - 1, fmt), decode(c, fmt)
        if math.isnan(hi) or math.isinf(hi):
            continue
        mid = np.float32((lo + hi) / 2)  # exact: one more bit than the format
        for v in (mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(1e9))):
            ties += [float(v), -float(v)]
    rand = [f32(rng.choice([-1, 1]) * 2.0 ** rng.uniform(-24, 20) * rng.random()) for _ in range(300)]
    return [f32(x) for x in specials], [f32(x) for x in ties], rand


def main():
    rng = random.Random(40)
    out = []
    for fmt in FORMATS:
        specials, ties, rand = inputs(rng, fmt)
        # (inputs, previous scale): amax nan (keeps 0.5); amax = max (scale 2^-margin: the ties stay
        # ties); random; amax 0 (keeps 0.25); amax inf (keeps 0.75); fp8_max / amax overflows (FLT_MAX)
        cases = [(specials + ties + rand, 0.5), (ties, 1.0), (rand, 1.0), ([0.0, -0.0, 0.0], 0.25),
                 ([1.0, math.inf, 2.0], 0.75), ([1e-42, -3e-43], 1.0)]
        for margin in (0, 1, 3):
            for xs, prev in cases:
                amax = amax_of(xs)
                s = scale_from_amax(amax, prev, fmt, margin)
                sf = np.float32(s)
                codes = [quantize(f32(float(np.float32(x) * sf)) if not math.isnan(x) else x, fmt) for x in xs]
                body = " ".join(f"{bits(x):08x} {c:02x}" for x, c in zip(xs, codes))
                out.append(f"q {fmt} {margin} {bits(prev):08x} {bits(amax):08x} {bits(s):08x} {len(xs)} {body}")
        for algo in ("max", "most_recent"):  # delayed scaling: per step the recorded amax, the scale after it
            for L in (1, 3):
                amaxes = [2.0, 0.5, 0.0, 8.0, math.inf, 0.25, math.nan, 1.0]
                hist, scale, scales = [0.0] * L, 1.0, []
                for a in amaxes:
                    hist[0] = math.nan if math.isnan(a) or math.isnan(hist[0]) else max(hist[0], a)
                    cur = hist[0] if algo == "most_recent" else (math.nan if any(map(math.isnan, hist)) else max(hist))
                    scale = scale_from_amax(cur, scale, fmt, 1)
                    scales.append(scale)
                    hist = hist[1:] + hist[:1]  # torch.roll(history, -1)
                    hist[0] = 0.0
                out.append(f"h {fmt} {algo} {L} 1 {len(amaxes)} " + " ".join(f"{bits(f32(a)):08x}" for a in amaxes)
                           + " ; " + " ".join(f"{bits(s):08x}" for s in scales))
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
