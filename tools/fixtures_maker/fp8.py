"""FP8 e4m3 quantisation: per tensor (ModelOpt) and 128x128 blocks (Qwen / DeepSeek)."""

import torch

FP8_MAX = 448.0
FP8_BLOCK = 128


def fp8_cast(x):
    """fp32 -> float8_e4m3fn: clamp to +-448, then torch's cast (round to nearest even)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_tensor_quantize(w):
    """Per-tensor FP8 (ModelOpt FP8): scale = amax/448 (fp32), q = e4m3(w / scale) (fp32 division)."""
    w = w.float().cpu()
    amax = w.abs().amax()
    scale = amax / FP8_MAX if float(amax) > 0 else torch.tensor(1.0)
    scale = scale.float().reshape(())
    return fp8_cast(w / scale).contiguous(), scale.clone()


def fp8_tensor_dequantize(q, scale):
    return q.float() * scale.float()


def _block_expand(s, n, k, b=FP8_BLOCK):
    return s.float().repeat_interleave(b, 0).repeat_interleave(b, 1)[:n, :k]


def fp8_block_quantize(w, b=FP8_BLOCK):
    """Block FP8 (Qwen -FP8 / DeepSeek style): per [128, 128] block (partial at the edges)
    weight_scale_inv = block amax / 448 (1.0 for an all-zero block), q = e4m3(w / block scale)."""
    w = w.float().cpu()
    n, k = w.shape
    nb, kb = -(-n // b), -(-k // b)
    pad = torch.zeros(nb * b, kb * b)
    pad[:n, :k] = w
    amax = pad.reshape(nb, b, kb, b).abs().amax(dim=(1, 3))
    s = amax / FP8_MAX
    s[amax == 0] = 1.0
    return fp8_cast(w / _block_expand(s, n, k, b)).contiguous(), s.float().contiguous()


def fp8_block_dequantize(q, s, b=FP8_BLOCK):
    n, k = q.shape
    return q.float() * _block_expand(s, n, k, b)
