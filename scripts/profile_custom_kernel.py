"""Launch the custom MLA kernel a few times on one shape, for Nsight Compute to profile.

    ncu -k regex:mla_attn --launch-skip 1 --launch-count 1 --section ... \
        python scripts/profile_custom_kernel.py --variant v1 --ctx 185000 --q-len 16 --heads 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from check_custom_kernel import gpu_batch  # noqa: E402

from decodecliff.kernels.custom import CustomAttention  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", default="v1")
    p.add_argument("--ctx", type=int, default=185000)
    p.add_argument("--q-len", type=int, default=16)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--tree", action="store_true")
    p.add_argument("--launches", type=int, default=3)
    a = p.parse_args()
    batch = gpu_batch([a.ctx], a.q_len, a.heads, page_size=a.page_size, tree=a.tree, seed=1)
    out = batch.new_output()
    step = CustomAttention(variant=a.variant).prepare(batch, out)
    for _ in range(a.launches):
        step()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
