#!/bin/bash
# The four device calls of run a5d7cd7, in order (carry .whl .sgl; see scripts/gpu_backends_run.sh
# for what they hold). Each wrote under /tmp/o and returned it as one tar; the folders here are
# those files, sorted by what they measure. Call 1 ran on 294dc28 with a5d7cd7's kernel change
# applied (REV=294dc28+v5-p-operand-order), calls 2-4 on a5d7cd7 (REV=a5d7cd7).
#   bash run.sh 1|2|3|4      (from the repository root, on the GPU machine)
call=${1:?call 1..4}
case $call in
1) (
# one call: v5 with P in A-operand order checked and timed (sm_120 model), then engine-l2
set -uo pipefail
export DECODECLIFF_GIT_REV=${REV:-unknown}
REAL_OUT=$OUT; export OUT=/tmp/o; mkdir -p $OUT
trap 'tar -C /tmp -cf $REAL_OUT/x.tar o' EXIT
source scripts/gpu_env.sh
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "commit $DECODECLIFF_GIT_REV"; } | tee "$OUT/env.txt"
el build
mkdir -p results/build && rm -f results/build/*.so
decodecliff build-kernel --arch 90 --require 90 --out results/build --sm120-model 90 > "$OUT/build.log" 2>&1 || tail -5 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
MODEL_LIB=$PWD/results/build/libdecodecliff_mla_sm120model.so
SHIM=$PWD/results/build/libdecodecliff_smem_shim.so
el check-sm120
DECODECLIFF_KERNEL_LIB=$MODEL_LIB timeout 120 decodecliff check-kernel --quick --no-timing --variants v5 --seed 2 \
  --out "$OUT/check_sm120.json" > "$OUT/check_sm120.log" 2>&1; echo "check sm120 rc $?"; tail -n 3 "$OUT/check_sm120.log"
el bench
LD_PRELOAD=$SHIM timeout 200 decodecliff bench-kernels --device cuda --backends custom flashinfer --sm120-model \
  --flashinfer-backends fa2 --repeats 20 --max-seconds-per-point 60 --quiet --custom-variants v4 v5 auto \
  --contexts 185000 --modes chain16 tree64 --page-sizes 1 --heads 8 --out "$OUT/sm120.json" > "$OUT/bench_sm120.log" 2>&1
echo "bench rc $?"; grep -E " ok | failed|ms" "$OUT/bench_sm120.log" | tail -n 20
el engine-l2
timeout 150 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_engine_gpu.py -k "l2_prefetch" > "$OUT/pytest_l2.log" 2>&1
echo "tests rc $?"; tail -n 1 "$OUT/pytest_l2.log"
for variant in cublas:0 cublas:32 cublas:16 auto:32; do
  [ $(( $(date +%s) - T0 )) -gt 470 ] && { echo "skip $variant"; continue; }
  gemm=${variant%%:*} mb=${variant#*:}
  timeout 100 decodecliff bench-engine --preset kimi-k2-tp8-rank --device cuda --paths graphs --modes chain --draft-len 16 \
    --repeats 5 --parts anatomy --gemm $gemm --l2-overlap-mb $mb --contexts 1024 16384 185000 --backends custom \
    --out "$OUT/engine_${gemm}_l2_$mb.json" > "$OUT/bench_engine_${gemm}_l2_$mb.log" 2>&1; echo "$variant rc $?"
  grep -E "step .* ms|failed|kernels, span" "$OUT/bench_engine_${gemm}_l2_$mb.log"
done
el check-sm90
[ $(( $(date +%s) - T0 )) -lt 500 ] && { timeout 80 decodecliff check-kernel --quick --no-timing --variants v5 --seed 1 \
  --out "$OUT/check.json" > "$OUT/check.log" 2>&1; echo "check sm90 rc $?"; tail -n 3 "$OUT/check.log"; }
el done
) ;;
2) (
# one call: v5 (P in operand order) at every issue-24 shape beside FlashInfer; engine L2 prefetch interleaved; ncu of v5
set -uo pipefail
export DECODECLIFF_GIT_REV=${REV:-unknown}
REAL_OUT=$OUT; export OUT=/tmp/o; mkdir -p $OUT
trap 'tar -C /tmp -cf $REAL_OUT/x.tar o' EXIT
source scripts/gpu_env.sh
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "commit $DECODECLIFF_GIT_REV"; } | tee "$OUT/env.txt"
el build
mkdir -p results/build && rm -f results/build/*.so
decodecliff build-kernel --arch 90 --require 90 --out results/build --sm120-model 90 > "$OUT/build.log" 2>&1 || tail -5 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
SHIM=$PWD/results/build/libdecodecliff_smem_shim.so
SM="decodecliff bench-kernels --device cuda --backends custom flashinfer --sm120-model --repeats 20 --max-seconds-per-point 60 --quiet --custom-variants v4 v5 auto --contexts 185000"
el kernels
LD_PRELOAD=$SHIM timeout 220 $SM --flashinfer-backends fa2 fa3 --modes decode chain16 --page-sizes 1 --heads 8 16 64 \
  --out "$OUT/sm120_shapes.json" > "$OUT/bench_sm120_shapes.log" 2>&1; echo "rc $?"; grep -E " ok | failed" "$OUT/bench_sm120_shapes.log"
LD_PRELOAD=$SHIM timeout 90 $SM --flashinfer-backends fa2 --modes chain16 tree64 --page-sizes 64 --heads 8 \
  --out "$OUT/sm120_p64.json" > "$OUT/bench_sm120_p64.log" 2>&1; echo "rc $?"; grep -E " ok | failed" "$OUT/bench_sm120_p64.log"
LD_PRELOAD=$SHIM timeout 90 $SM --flashinfer-backends fa2 --modes chain16 decode --page-sizes 1 --heads 8 --batch 4 --ragged \
  --out "$OUT/sm120_ragged.json" > "$OUT/bench_sm120_ragged.log" 2>&1; echo "rc $?"; grep -E " ok | failed" "$OUT/bench_sm120_ragged.log"
el engine-l2-interleaved
i=0
for variant in cublas:0 cublas:16 cublas:0 cublas:16; do
  i=$((i+1)); [ $(( $(date +%s) - T0 )) -gt 420 ] && { echo "skip $variant"; continue; }
  gemm=${variant%%:*} mb=${variant#*:}
  timeout 80 decodecliff bench-engine --preset kimi-k2-tp8-rank --device cuda --paths graphs --modes chain --draft-len 16 \
    --repeats 5 --parts anatomy --gemm $gemm --l2-overlap-mb $mb --contexts 1024 185000 --backends custom \
    --out "$OUT/engine_${i}_${gemm}_l2_$mb.json" > "$OUT/bench_engine_${i}_${gemm}_l2_$mb.log" 2>&1; echo "$i $variant rc $?"
  grep -E "step .* ms|failed" "$OUT/bench_engine_${i}_${gemm}_l2_$mb.log"
done
el ncu
[ $(( $(date +%s) - T0 )) -lt 440 ] && OUT=$OUT/profile SM120_MODEL=1 timeout 120 bash scripts/profile_kernels.sh v5:185000:16:8
el done
) ;;
3) (
set -uo pipefail
export DECODECLIFF_GIT_REV=${REV:-unknown}
REAL_OUT=$OUT; export OUT=/tmp/o; mkdir -p $OUT
trap 'tar -C /tmp -cf $REAL_OUT/x.tar o' EXIT
source scripts/gpu_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "commit $DECODECLIFF_GIT_REV"; } | tee "$OUT/env.txt"
mkdir -p results/build && rm -f results/build/*.so
decodecliff build-kernel --arch 90 --require 90 --out results/build --sm120-model 90 > "$OUT/build.log" 2>&1 || tail -5 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
timeout 200 decodecliff bench-engine --preset kimi-k2-tp8-rank --device cuda --paths graphs --modes chain --draft-len 16 \
  --repeats 5 --parts anatomy --contexts 1024 185000 --backends custom custom:model=sm120 flashinfer:model=sm120 \
  --out "$OUT/engine_sm120.json" > "$OUT/bench_engine_sm120.log" 2>&1; echo "rc $?"
grep -E "step .* ms|failed" "$OUT/bench_engine_sm120.log"
) ;;
4) (
set -uo pipefail
REAL_OUT=$OUT; export OUT=/tmp/o; mkdir -p $OUT
trap 'tar -C /tmp -cf $REAL_OUT/x.tar o' EXIT
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "commit ${REV:-unknown}"; } | tee "$OUT/env.txt"
OUT=$OUT/profile SM120_MODEL=1 timeout 330 bash scripts/profile_kernels.sh v5:185000:64:8:tree v5:185000:16:16 v5:185000:16:64 v4:185000:1:8 v5:185000:1:64
rm -f $OUT/profile/*.ncu-rep.big 2>/dev/null; du -sh $OUT
) ;;
esac
