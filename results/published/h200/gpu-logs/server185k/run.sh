#!/bin/bash
# One GPU call: the custom backend's GPU tests at this commit, then the custom + CUDA graphs server
# of config/h200.yaml at 185k through the HTTP API (three recorded requests after the warm-up).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src TRITON_INTERPRET=0
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodecliff.cli "$@"\n' > /tmp/bin/decodecliff
chmod +x /tmp/bin/decodecliff && export PATH=/tmp/bin:$PATH
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
git rev-parse HEAD 2>/dev/null
el build
decodecliff build-kernel --arch 90 --require 90 --out build/kernels > $OUT/build.log 2>&1 || { tail $OUT/build.log; exit 1; }
export DECODECLIFF_KERNEL_LIB=$PWD/build/kernels/libdecodecliff_mla.so
el tests
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_custom_gpu.py 2>&1 | tail -3 | tee $OUT/pytest_custom_gpu.log
el sweep
timeout 200 decodecliff sweep --server-cmd 'decodecliff serve --preset kimi-k2-tp8-rank --backend custom --device cuda --page-size 1 --chunk-size 4096 --spec chain --draft-len 16 --tree-nodes 64 --cuda-graph --prefill-attention mha --scatter-seed 0 --host {host} --port {port}' \
  --name custom-graph-p1 --contexts 185000 --gen-tokens 24 --requests-per-point 3 --concurrency 1 \
  --point-timeout 150 --chunk-timeout 190 --start-timeout 90 --no-progress --heartbeat 30 \
  --out $OUT/sweep --server-log $OUT/server.log 2>&1 | tee $OUT/sweep.log
el done
