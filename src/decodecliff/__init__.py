"""decodecliff: the long-context MLA verify-decode study."""

import glob
import os

__version__ = "0.1.0"

# Without an NVIDIA GPU the Triton baseline runs under Triton's interpreter, which must be chosen
# before anything imports triton (torch._dynamo does, on import).
if "TRITON_INTERPRET" not in os.environ and not glob.glob("/dev/nvidia[0-9]*"):
    os.environ["TRITON_INTERPRET"] = "1"
