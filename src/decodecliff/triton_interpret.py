"""Whether Triton kernels run compiled or in Triton's interpreter: the package's one decision.

Triton reads TRITON_INTERPRET once, when it is imported, and ``import torch._dynamo`` already
imports it; so the choice is made by the package's ``__init__``, before anything else runs. It looks
for NVIDIA device files (and a CUDA_VISIBLE_DEVICES that hides them all) instead of asking
``torch.cuda``: importing torch there would slow every command's start.
"""

from __future__ import annotations

import glob
import os

ENV = "TRITON_INTERPRET"
NVIDIA_DEVICES = "/dev/nvidia[0-9]*"


def gpu_visible() -> bool:
    """An NVIDIA device file exists and CUDA_VISIBLE_DEVICES does not hide every GPU."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")
    return not hidden and bool(glob.glob(NVIDIA_DEVICES))


def triton_interpreted() -> bool:
    """True when Triton runs interpreted; sets TRITON_INTERPRET=1 where no GPU is visible.

    An explicit TRITON_INTERPRET in the environment wins (the pipeline sets it from the configured
    device). Calling it again gives the same answer, so every module asks it rather than deciding.
    """
    if ENV not in os.environ and not gpu_visible():
        os.environ[ENV] = "1"
    return os.environ.get(ENV, "0") not in ("", "0")
