#!/bin/bash
# Measure the bench rules of config/h200.yaml on the GPU machine with the pipeline's own commands.
#
#   run_benches.sh COMMIT PART [PART ...]     PART: build | engine | kernels   (carry: .whl)
#
# Each command is the rule's shell command as `snakemake -n -p --configfile config/h200.yaml
# results/build/build.json results/engine/bench.json results/kernels/bench.json` prints it, with
# results/ of the machine's copy of the tree. .whl holds the kernel bench's peers (sglang 0.5.23,
# flashinfer-python 0.5.3, apache-tvm-ffi 0.1.15.post2; sha256 in ../peers/env.txt), installed
# without dependencies. What the parts wrote, less the kernel library, is packed into
# $OUT/benches.tar after every part; the kernel bench writes its file after every point, so a cut
# run keeps them.
set -uo pipefail
export DECODECLIFF_GIT_REV=$1 PYTHONUNBUFFERED=1
shift
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodecliff.cli "$@"\n' > /tmp/bin/decodecliff
chmod +x /tmp/bin/decodecliff && export PATH=/tmp/bin:$PATH
mkdir -p results/logs/build results/logs/engine results/logs/kernels
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
echo "commit $DECODECLIFF_GIT_REV"
pack() { tar --exclude '*.so' -cf "$OUT/benches.tar" results/logs results/build results/engine results/kernels 2>/dev/null; }
for part in "$@"; do
  el "$part"
  case $part in
    build) decodecliff build-kernel --arch 120 90 80 --require 120 90 80 --out results/build > results/logs/build/build_kernel.log 2>&1 || { tail -n 3 results/logs/build/build_kernel.log >&2; exit 1; } ;;
    engine) (export DECODECLIFF_KERNEL_LIB=results/build/libdecodecliff_mla.so TRITON_INTERPRET=0; exec decodecliff bench-engine --preset kimi-k2-tp8-rank --device cuda --backends custom triton --paths graphs eager --contexts 1024 32768 131072 185000 --modes chain --draft-len 16 --repeats 5 --parts anatomy loop --loop-contexts 185000 --out results/engine/bench.json > results/logs/engine/bench_engine.log 2>&1) ;;
    kernels) (export DECODECLIFF_KERNEL_LIB=results/build/libdecodecliff_mla.so TRITON_INTERPRET=0; exec decodecliff bench-kernels --device cuda --backends torch triton custom sglang flashinfer cublas --contexts 1024 4096 16384 32768 65536 131072 185000 --modes decode chain16 tree64 --page-sizes 1 64 --heads 8 64 --max-seconds-per-point 60 --repeats 20 --triton-config sm90 sm120 --decode-splits sglang 8 64 --out results/kernels/bench.json > results/logs/kernels/bench_kernels.log 2>&1) ;;
    *) echo "unknown part $part"; continue ;;
  esac
  echo "rc $?"; tail -n 2 results/logs/$part*/*.log 2>/dev/null | tail -n 3
  pack
done
el done
