#!/bin/bash
# One GPU machine lease: checks, then the step anatomy (new code), the old code's baseline, the loop.
export DECODECLIFF_GIT_REV=79b4eec80ba417a375bf4aabc0306b9f34aa1799 PYTHONUNBUFFERED=1 DECODECLIFF_KERNEL_LIB=$PWD/.engine-kernel/libdecodecliff_mla.so
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.version.cuda)"
el tests
PYTHONPATH=.engine-kernel/new/src timeout 120 python3 -m pytest -q -p no:cacheprovider .engine-kernel/new/tests/test_engine_gpu.py \
  -k "fused or cuda_graphs_match_eager" 2>&1 | tail -6
el anatomy
K="--preset kimi-k2-tp8-rank --modes chain --draft-len 16 --page-size 1 --repeats 5"
PYTHONPATH=.engine-kernel/new/src timeout 240 python3 -m decodecliff.cli bench-engine $K --backends custom triton \
  --paths graphs eager --contexts 1024 32768 185000 --parts anatomy --out $OUT/engine.json 2>&1 | grep -v USDT
el layout-nk
PYTHONPATH=.engine-kernel/new/src timeout 60 python3 -m decodecliff.cli bench-engine $K --backends custom --paths graphs \
  --contexts 1024 --repeats 3 --weight-layout nk --out $OUT/engine-nk.json 2>&1 | grep -v "USDT\|^target"
el loop
PYTHONPATH=.engine-kernel/new/src timeout 120 python3 -m decodecliff.cli bench-engine $K --backends custom \
  --paths graphs eager --contexts 185000 --parts loop --loop-steps 40 --out $OUT/engine-loop.json 2>&1 | grep -v USDT
el done
