#!/bin/bash
# One GPU call: the backend contract on the GPU, the baseline's fidelity to SGLang's own kernels and
# FlashInfer beside them (kernel bench), and the step anatomy of the servers a user would pick.
#
#   scripts/gpu_backends_run.sh COMMIT     (carry: .whl .sgl; writes its logs and JSON to $OUT)
#
# .whl holds FlashInfer's wheels for the device's Python 3.12 (flashinfer-python 0.5.3,
# apache-tvm-ffi 0.1.15.post2), installed without dependencies; .sgl the part of SGLang 0.5.23's
# wheel the peers read (sglang/kernels/ops/attention, srt/utils, srt/layers/attention/
# triton_backend.py and its dist-info: the whole wheel would pass the call's size limit). Each part has its own time
# limit, so a slow part leaves the others' files.
set -uo pipefail
export DECODECLIFF_GIT_REV=$1 PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/.sgl:$PWD/src
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodecliff.cli "$@"\n' > /tmp/bin/decodecliff
chmod +x /tmp/bin/decodecliff && export PATH=/tmp/bin:$PATH
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "commit $DECODECLIFF_GIT_REV"; } | tee "$OUT/env.txt"
el build
decodecliff build-kernel --arch 90 --require 90 --out build/kernels > "$OUT/build.log" 2>&1 || tail -3 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/build/kernels/libdecodecliff_mla.so
el contract
timeout 200 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_backend_contract.py \
  tests/test_peers_fidelity.py > "$OUT/pytest.log" 2>&1; echo "rc $?"; tail -n 2 "$OUT/pytest.log"
el kernels
timeout 200 decodecliff bench-kernels --device cuda --backends triton sglang flashinfer custom \
  --contexts 1024 16384 65536 185000 --modes decode chain16 --page-sizes 1 --heads 8 \
  --repeats 20 --triton-config auto --decode-splits sglang --index-dtypes int64 int32 \
  --flashinfer-backends fa2 fa3 --max-seconds-per-point 60 --quiet \
  --out "$OUT/kernels.json" > "$OUT/bench_kernels.log" 2>&1; echo "rc $?"
grep fidelity "$OUT/bench_kernels.log"
el engine
timeout 240 decodecliff bench-engine --preset kimi-k2-tp8-rank --device cuda \
  --backends custom sglang flashinfer flashinfer:backend=fa3 --paths graphs \
  --contexts 1024 32768 131072 185000 --modes chain --draft-len 16 --repeats 5 --parts anatomy \
  --out "$OUT/engine.json" > "$OUT/bench_engine.log" 2>&1; echo "rc $?"
grep -E "step .* ms|failed" "$OUT/bench_engine.log" | tail -n 20
el done
