#!/usr/bin/env bash
# What a lent GPU machine (no network; its own Python 3.12, torch and Triton) needs beside the
# tree to run the peers, made here from PyPI into two ignored folders that a device call carries:
#
#   scripts/gpu_carry.sh [PYTHON]            (PYTHON: the device's, 3.12 unless given)
#
# .whl: FlashInfer's and apache-tvm-ffi's wheels for that Python, and httpx-sse's (the clients' SSE
# reader, pure Python, which that machine's Python may lack), which gpu_env.sh installs there
# without dependencies; .sgl: the part of SGLang's wheel the peers read (its Triton attention
# kernels, srt/utils, the Triton backend's source that tests/test_peers_fidelity.py reads, the
# dist-info that names its version), less the kernel folders those never import, so that the tree
# and both folders stay under a call's 64 MiB. The versions are the `peers` extra's
# and the package's (pyproject.toml; tests/test_gpu_carry.py keeps them alike).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-3.12}
FLASHINFER=0.5.3 TVM_FFI=0.1.15.post2 SGLANG=0.5.23 HTTPX_SSE=0.4.3
UNUSED=(dsv4 flash_attn fa4_sm120 fla linear dsa minimax_sparse cutedsl_gdn_mtp_ring.py)
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014; do
  platforms+=(--platform "${p}_x86_64")
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# made in $tmp and swapped in at the end: a download that fails keeps the folders there were
new=$tmp/new
mkdir "$new"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" \
  --implementation cp "${platforms[@]}" -d "$new/.whl" \
  "flashinfer-python==$FLASHINFER" "apache-tvm-ffi==$TVM_FFI" "httpx-sse==$HTTPX_SSE"
# SGLang's wheel is built per Python, but the files taken from it are Python source alone
python3 -m pip download -q --no-deps -d "$tmp" "sglang==$SGLANG"
mkdir "$new/.sgl"
(cd "$new/.sgl" && python3 -m zipfile -e "$tmp"/sglang-"$SGLANG"-*.whl . \
  && find . -mindepth 1 -maxdepth 1 ! -name sglang ! -name "sglang-$SGLANG.dist-info" \
    -exec rm -rf {} + \
  && find sglang -mindepth 1 -maxdepth 1 ! -name kernels ! -name srt -exec rm -rf {} + \
  && find sglang/kernels -mindepth 1 -maxdepth 1 ! -name ops -exec rm -rf {} + \
  && find sglang/kernels/ops -mindepth 1 -maxdepth 1 ! -name attention -exec rm -rf {} + \
  && find sglang/srt -mindepth 1 -maxdepth 1 ! -name utils ! -name layers -exec rm -rf {} + \
  && find sglang/srt/layers -mindepth 1 -maxdepth 1 ! -name attention -exec rm -rf {} + \
  && find sglang/srt/layers/attention -mindepth 1 -maxdepth 1 ! -name triton_backend.py \
    -exec rm -rf {} + \
  && (cd sglang/kernels/ops/attention && rm -rf "${UNUSED[@]}"))
rm -rf .whl .sgl
mv "$new/.whl" "$new/.sgl" .
du -sh .whl .sgl
