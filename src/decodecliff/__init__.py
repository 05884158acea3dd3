"""decodecliff: the long-context MLA verify-decode study."""

from .triton_interpret import triton_interpreted

__version__ = "0.1.0"

# Triton's interpreter must be chosen before anything imports triton (torch._dynamo does).
triton_interpreted()
