"""NVFP4 (ModelOpt) quantisation: E2M1 codes, e4m3 per-16 scales, fp32 scale_2."""

import torch

E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def cast_fp4(x):
    """ModelOpt _cast_fp4: nearest, ties at bounds with odd index (0.75,1.75,3.5) round up,
    at even index (0.25,1.25,2.5,5) round down (= round-half-to-even code)."""
    mask = torch.tensor([0, 1, 0, 1, 0, 1, 0], dtype=torch.uint8)
    sign = (x < 0).to(torch.uint8)
    a = x.abs()
    ordv = torch.searchsorted(E2M1_BOUNDS, a.contiguous(), out_int32=True).to(torch.uint8)
    rnd = torch.any((a.unsqueeze(-1) == E2M1_BOUNDS) * mask, dim=-1).to(torch.uint8)
    return (sign * 8 + ordv + rnd).to(torch.uint8)


def nvfp4_quantize(w, scale_2=None):
    """w fp32 [N, K]. Returns packed u8 [N,K/2], scale e4m3 [N,K/16], scale_2 fp32 []."""
    w = w.float().cpu()
    n, k = w.shape
    assert k % 16 == 0
    if scale_2 is None:
        scale_2 = w.abs().amax() / (6.0 * 448.0)
    scale_2 = scale_2.float().reshape(())
    blk = w.reshape(n, k // 16, 16)
    per_block_amax = blk.abs().amax(-1)
    per_block_scale = per_block_amax / 6.0
    q = per_block_scale / scale_2
    q[per_block_scale == 0] = 1.0
    q = q.clamp(2.0 ** -9, 448.0).to(torch.float8_e4m3fn)
    scaled = blk / (q.float() * scale_2).unsqueeze(-1)
    codes = cast_fp4(scaled.reshape(n, k))
    packed = (codes[:, 1::2] << 4) | codes[:, 0::2]
    return packed.contiguous(), q.contiguous(), scale_2.clone()


def nvfp4_dequantize(packed, scale, scale_2):
    n, kh = packed.shape
    k = kh * 2
    codes = torch.empty(n, k, dtype=torch.long)
    codes[:, 0::2] = (packed & 0xF).long()
    codes[:, 1::2] = (packed >> 4).long()
    vals = E2M1_VALUES[codes].reshape(n, k // 16, 16)
    return (vals * (scale.float() * scale_2.float()).unsqueeze(-1)).reshape(n, k)
