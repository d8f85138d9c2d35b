"""Facts every part of the tool shares: the formats, safetensors dtype sizes, the repository root."""

import os
import sys

# tools/synthetic_checkpoint/common.py -> the repository root (configs/, tests/fixtures/).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPE_SIZE = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
FP8_BLOCK = 128   # fp8-block: one F32 scale per 128x128 weight block
FORMATS = ("nvfp4", "bf16", "nvfp4-v2", "nvfp4-mixed", "fp8-block")
MODELOPT_MIXED = ("nvfp4-v2", "nvfp4-mixed")
GROUP = 16        # NVFP4: input elements per E4M3 block scale


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def gb(n):
    return f"{n / 1e9:.2f} GB"
