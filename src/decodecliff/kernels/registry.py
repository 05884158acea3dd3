"""Backends by name: one line each. Imports are lazy so the CPU path never needs Triton or CUDA.

A backend is one module with one class implementing ``api.AttentionBackend``; adding one is a line
in ``BACKENDS`` (and, if it needs a GPU or a package, a line in ``GPU_ONLY`` / ``PACKAGES``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # api.py loads torch; the names below must not
    from .api import AttentionBackend

BACKENDS = {
    "torch": ("decodecliff.kernels.reference", "TorchAttention"),
    "triton": ("decodecliff.kernels.triton_baseline", "TritonAttention"),
    "custom": ("decodecliff.kernels.custom", "CustomAttention"),
    # peers a user could pick instead (kernels/peers.py; the `peers` extra installs them)
    "sglang": ("decodecliff.kernels.peers", "SGLangAttention"),
    "flashinfer": ("decodecliff.kernels.peers", "FlashInferAttention"),
    "cublas": ("decodecliff.kernels.peers", "CublasAttention"),
}
# The options a spec ("NAME:KEY=VALUE") or `serve --backend-option` may set: each backend's
# constructor keywords that a KEY=VALUE can give (tests/test_kernels_cpu.py keeps them in step).
OPTIONS = {
    "torch": (),
    "triton": ("arch_config", "decode", "num_kv_splits", "index_dtype"),
    "custom": ("num_splits", "lib_path", "variant", "model"),
    "sglang": ("kernel", "num_kv_splits", "max_context_len", "index_dtype", "interpreted"),
    "flashinfer": ("backend", "model"),
    "cublas": (),
}
# The values of the options that take one of a few (None aside, where an option may be left
# unset): the constructors check against these, and a study's config check reads them here,
# without torch.
CHOICES = {
    "triton": {"decode": ("grouped", "extend"), "index_dtype": ("int32", "int64")},
    "custom": {"variant": ("v1", "v2", "v3", "v4", "v5", "auto"), "model": ("sm120",)},
    "sglang": {"kernel": ("extend", "verify", "decode"), "index_dtype": ("int32", "int64")},
    "flashinfer": {"backend": ("fa2", "fa3"), "model": ("sm120",)},
}
# Options that take a count (an integer >= 0; a constructor may bound it further).
COUNTS = {"custom": ("num_splits",), "sglang": ("max_context_len",)}
# Options that take true or false (a spec's text "true" / "false" becomes the bool).
FLAGS = {"sglang": ("interpreted",)}
GPU_ONLY = {"custom", "sglang", "flashinfer"}  # recorded as skipped (with the reason) on a CPU
# The package a peer loads, and how to install it (the `peers` extra pins the versions).
PACKAGES = {
    "sglang": ("sglang", "pip install -e '.[peers]' (or pip install --no-deps sglang)"),
    "flashinfer": ("flashinfer", "pip install -e '.[peers]' (or pip install flashinfer-python)"),
}


def unavailable(name: str, device: str) -> str | None:
    """Why backend ``name`` cannot run on ``device`` ("cpu" / "cuda") here, or None if it can.

    Cheap and torch-free (no backend is built), so a study can record a server or a bench point
    as skipped, with this reason, before it starts anything.
    """
    if name not in BACKENDS:
        return f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}"
    if name in GPU_ONLY and device != "cuda":
        return f"the {name} backend needs a CUDA GPU (the device is {device})"
    if name in PACKAGES:
        module, how = PACKAGES[name]
        if not _installed(module):
            return f"the {name} backend needs the {module} package, not installed here: {how}"
    return None


def _installed(module: str) -> bool:
    if module in sys.modules:  # loaded already (the sglang peer registers its package as a stub)
        return True
    if module == "sglang" and os.environ.get("DECODECLIFF_SGLANG_PATH"):
        return True  # kernels/peers.py loads SGLang's files from that folder
    return importlib.util.find_spec(module) is not None


def parse_spec(spec: str) -> tuple[str, dict[str, object]]:
    """A backend and its options from ``NAME[:KEY=VALUE,...]``: "flashinfer:backend=fa3"."""
    name, _, rest = spec.partition(":")
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    options: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"backend option {item!r} of {spec!r} is not KEY=VALUE")
        options[key] = option_value(key, value)
    check_options(name, options)
    return name, options


def option_value(key: str, text: str) -> object:
    """A KEY=VALUE's value as a backend takes it, however it was given (a spec, `serve
    --backend-option`, a study config's text): a flag's true / false as the bool, an integer as
    one, the rest as text."""
    if any(key in flags for flags in FLAGS.values()) and text in ("true", "false"):
        return text == "true"
    return int(text) if text.lstrip("-").isdigit() else text


def check_options(name: str, options: dict[str, object]) -> None:
    """ValueError naming an option that backend ``name`` does not take, and those it does, or a
    value outside an option's CHOICES, or a count or flag that is not one."""
    unknown = sorted(set(options) - set(OPTIONS[name]))
    if unknown:
        takes = ", ".join(OPTIONS[name]) or "none"
        raise ValueError(f"the {name} backend has no option {unknown[0]!r} (its options: {takes})")
    for key, value in options.items():
        allowed = CHOICES.get(name, {}).get(key)
        if allowed and value is not None and value not in allowed:  # None: the default
            raise ValueError(
                f"the {name} backend's {key} must be one of {list(allowed)}, not {value!r}"
            )
        is_count = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if key in COUNTS.get(name, ()) and value is not None and not is_count:
            raise ValueError(f"the {name} backend's {key} must be an integer >= 0, not {value!r}")
        if key in FLAGS.get(name, ()) and not isinstance(value, bool):
            raise ValueError(f"the {name} backend's {key} must be true or false, not {value!r}")


def needs_kernel_lib(name: str, options: dict[str, object]) -> bool:
    """Whether a backend loads what build-kernel builds: the custom kernel, or a peer run as on
    sm_120 (model=sm120), whose shared-memory shim is built beside it (kernels/sm120_model.py)."""
    return name == "custom" or options.get("model") == "sm120"


def spec_label(spec: str) -> str:
    """How results name a backend spec, as the kernel bench names its series:
    "flashinfer:backend=fa3" -> "flashinfer (fa3)", "flashinfer:backend=fa2,model=sm120" ->
    "flashinfer (fa2-sm120)"; a number keeps its key ("custom:num_splits=8" -> "custom
    (num_splits=8)"); a plain name stays as it is."""
    name, options = parse_spec(spec)
    parts = [_label_part(k, v) for k, v in options.items()]
    return f"{name} ({'-'.join(parts)})" if options else name


def _label_part(key: str, value: object) -> str:
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    return f"{key}={value}" if isinstance(value, int) else str(value)


def get_backend(name: str, **options: object) -> AttentionBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    check_options(name, options)
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)(**options)
