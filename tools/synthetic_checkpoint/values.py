"""The random values: pools of random bytes that pool tensors are slices of, the E4M3 / BF16 encodings,
and the small tensors (norms, conv1d, A_log, dt_bias) drawn per tensor."""

import math

import numpy as np

from .common import MODELOPT_MIXED

WEIGHT_STD = 0.02
NORM_STD = 0.02
POOL_BF16_BYTES = 64 << 20
POOL_U8_BYTES = 64 << 20
POOL_E4M3_BYTES = 8 << 20
POOL_FP8W_BYTES = 16 << 20   # FP8 weight codes (nvfp4-v2 / nvfp4-mixed / fp8-block only)
POOL_F32S_BYTES = 4 << 20    # FP8 block scales, F32 (fp8-block only)
E4M3_CODES = np.arange(0x68, 0x7F, dtype=np.uint8)  # 64 .. 448; 0x7F (NaN) excluded
FP8_CODE_STD = 80.0          # FP8 weight codes ~ N(0, 80) rounded to E4M3, clipped to +-448 (amax ~ 5 sigma)
E2M1_VALUES = np.array(  # NVFP4 (E2M1) code -> value
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def pool_sizes(fmt):
    """Bytes of each pool `fmt` slices; the FP8 pools only for the formats that use them."""
    sizes = {"pool_bf16": POOL_BF16_BYTES, "pool_u8": POOL_U8_BYTES, "pool_e4m3": POOL_E4M3_BYTES}
    if fmt in MODELOPT_MIXED + ("fp8-block",):
        sizes["pool_fp8w"] = POOL_FP8W_BYTES
    if fmt == "fp8-block":
        sizes["pool_f32s"] = POOL_F32S_BYTES
    return sizes


def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def e4m3_to_f32(codes):
    c = codes.astype(np.int32)
    e, mant = (c >> 3) & 0xF, c & 7
    v = np.where(e == 0, mant / 8.0 * 2.0 ** -6, (1 + mant / 8.0) * 2.0 ** (e - 7.0))
    return np.where(c & 0x80, -v, v)


def fp8_positive_table():
    """Finite non-negative E4M3 codes 0x00..0x7E (value increases with the code) and their values."""
    codes = np.arange(0x00, 0x7F, dtype=np.uint8)
    return codes, e4m3_to_f32(codes)


def fp8_code_rms():
    """RMS of the decoded FP8 weight codes of pool_fp8w: N(0, FP8_CODE_STD) rounded to the nearest
    E4M3 value, clipped to +-448 (exact, from the normal CDF, so that the plan needs no pool)."""
    _, vals = fp8_positive_table()
    mids = (vals[1:] + vals[:-1]) / 2
    cdf = lambda x: 0.5 * math.erfc(-x / (FP8_CODE_STD * math.sqrt(2)))  # noqa: E731
    edges = [0.0] + [float(x) for x in mids] + [math.inf]
    # P(|x| in [edges[i], edges[i+1])) = 2 (cdf(hi) - cdf(lo))
    ms = sum(2 * (cdf(hi) - cdf(lo)) * float(v) ** 2 for lo, hi, v in zip(edges[:-1], edges[1:], vals))
    return math.sqrt(ms)


def fp8_weight_codes(rng, n):
    """n FP8 E4M3 weight codes ~ N(0, FP8_CODE_STD) rounded to nearest, clipped to +-448: never NaN."""
    codes, vals = fp8_positive_table()
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    x = rng.standard_normal(n, dtype=np.float32) * np.float32(FP8_CODE_STD)
    out = codes[np.searchsorted(mids, np.abs(x))]
    out |= (x < 0).astype(np.uint8) << np.uint8(7)
    return out


def make_pools(rng, sizes):
    pools = {}
    n = sizes["pool_bf16"] // 2
    pools["pool_bf16"] = f32_to_bf16_bits(rng.standard_normal(n, dtype=np.float32) * np.float32(WEIGHT_STD))
    pools["pool_u8"] = np.frombuffer(rng.bytes(sizes["pool_u8"]), dtype=np.uint8)
    pools["pool_e4m3"] = rng.choice(E4M3_CODES, size=sizes["pool_e4m3"])
    # The FP8 formats' pools come after (and only when asked for): the others' output is unchanged.
    if "pool_fp8w" in sizes:
        pools["pool_fp8w"] = fp8_weight_codes(rng, sizes["pool_fp8w"])
    if "pool_f32s" in sizes:
        base = WEIGHT_STD / fp8_code_rms()
        v = base * np.exp(rng.normal(0.0, 0.15, sizes["pool_f32s"] // 4))
        pools["pool_f32s"] = v.astype("<f4")
    return {k: memoryview(v).cast("B") for k, v in pools.items()}


def small_values(t, seed, index):
    """Bytes of a small tensor (norms, conv, A_log, dt_bias), from its own RNG stream."""
    rng = np.random.default_rng([seed, 1, index])
    n = math.prod(t.shape)
    if t.arg == "norm0":
        v = rng.standard_normal(n) * NORM_STD
    elif t.arg == "norm1":
        v = 1.0 + rng.standard_normal(n) * NORM_STD
    elif t.arg == "conv":
        v = rng.uniform(-0.5, 0.5, n)
    elif t.arg == "a_log":
        v = np.log(rng.uniform(1.0, 16.0, n))
    elif t.arg == "dt_bias":
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(0.1), n))
        v = dt + np.log(-np.expm1(-dt))  # inverse softplus
    else:
        raise ValueError(t.arg)
    if t.dtype == "F32":
        return v.astype("<f4").tobytes()
    return f32_to_bf16_bits(v).astype("<u2").tobytes()
