"""The C interface of the custom kernel library: the extern "C" block of csrc/mla_verify.cu.

Each exported function's parameters are listed here once, by name and ctypes type, in the C
prototype's order; ``bind`` derives the ctypes signatures from them and ``mla_attention_args``
orders a call's arguments by name. tests/test_kernel_abi.py parses the C prototypes and fails when
they and this table disagree. No torch here: the build step loads the library through it too.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

PTR, INT, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
Params = tuple[tuple[str, type], ...]

# out[total_q, H, 512] = attention(q, paged latent KV); returns a cudaError_t.
MLA_ATTENTION: Params = (
    ("q", PTR), ("kv", PTR), ("page_table", PTR), ("kv_lens", PTR), ("q_indptr", PTR),
    ("tree_mask", PTR), ("out", PTR), ("ws_o", PTR), ("ws_lse", PTR),
    ("batch", INT), ("heads", INT), ("total_q", INT), ("max_q_len", INT), ("page_size", INT),
    ("pt_stride", INT), ("tree_stride", INT), ("num_splits", INT), ("split_tokens", INT),
    ("mtiles", INT), ("variant", INT), ("dependent", INT), ("sm_scale", FLOAT),
    ("stream", PTR),  # last, so a prepared call's arguments can be fixed before the stream is known
)  # fmt: skip

# The library's dcmla_abi_version() this table describes (raised with any change to a
# parameter or to what an answer means; 3: dcmla_ctas_per_sm counts v5's own 64-row CTAs).
ABI_VERSION = 3

# name -> (return type, parameters): every function the library exports.
FUNCTIONS: dict[str, tuple[type, Params]] = {
    "dcmla_abi_version": (INT, ()),
    "dcmla_max_splits": (INT, ()),
    "dcmla_model_smem_per_sm": (INT, ()),
    "dcmla_smem_bytes": (INT, (("variant", INT), ("mtiles", INT))),
    "dcmla_error_string": (ctypes.c_char_p, (("code", INT),)),
    "dcmla_ctas_per_sm": (INT, (("variant", INT), ("mtiles", INT), ("out", ctypes.POINTER(INT)))),
    "dcmla_mla_attention": (INT, MLA_ATTENTION),
}


class StaleLibrary(RuntimeError):
    """A kernel library built from other source than this package's: its calls would misread
    their arguments."""


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argtypes and restype of every function in FUNCTIONS on a loaded library, after
    checking that it was built for this interface (StaleLibrary otherwise)."""
    version = getattr(lib, "dcmla_abi_version", None)
    found = None if version is None else ctypes.CFUNCTYPE(INT)(version)()
    if found != ABI_VERSION:
        has = "no interface version" if found is None else f"interface version {found}"
        raise StaleLibrary(
            f"{getattr(lib, '_name', 'the kernel library')} has {has}, this package needs "
            f"{ABI_VERSION}: rebuild it (decodecliff build-kernel)"
        )
    for name, (restype, params) in FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctype for _, ctype in params]
        fn.restype = restype
    return lib


_MLA_NAMES = tuple(name for name, _ in MLA_ATTENTION[:-1])  # the stream is given per launch


def mla_attention_args(values: Mapping[str, object]) -> tuple:
    """dcmla_mla_attention's positional arguments but the trailing stream, from their names."""
    if values.keys() != set(_MLA_NAMES):
        missing, unknown = set(_MLA_NAMES) - values.keys(), values.keys() - set(_MLA_NAMES)
        raise TypeError(
            f"dcmla_mla_attention: missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    return tuple(values[name] for name in _MLA_NAMES)
