#!/bin/bash
# GPU calls of the backend work, each part the pipeline's own command, logs and JSON to $OUT:
#
#   scripts/gpu_backends_run.sh COMMIT PART [PART ...]          (carry: .whl .sgl)
#   PART: contract | kernels | fidelity | engine | sm120 | sm120-more | short-splits
#         | short-ragged | ragged-v5 | ragged-v5-tree | engine-sm120 | engine-pdl | engine-gemms | engine-l2 | engine-fused
#         | profile-sm120 | profile-ragged | v5-patches
#   (a study's points and benches at one commit: gpu_study_run.sh; the GPU tests: gpu_tests.sh)
#
# contract: the backend contract's tests on the GPU; kernels: the baseline, SGLang's kernels,
# FlashInfer (fa2, fa3) and the custom kernel side by side (both index dtypes); fidelity: the
# same for the baseline and SGLang only; engine: the step anatomy of the servers a user would pick;
# sm120: the custom variants checked (float64, planted masks) in both builds, then timed beside
# FlashInfer on the H200's resources and as both configure themselves on sm_120
# (kernels/sm120_model.py: the model library, FlashInfer under LD_PRELOAD of the shim), at 185k:
# decode, chain16 and tree64 at 8, 16 and 64 heads, and chain16 at page 64;
# sm120-more: v4, v5 and auto beside FlashInfer, both builds, for a ragged batch of four (185k
# down to 46k), chain16 and decode at 8 heads; short-splits: auto, v4 and v5 at their own
# plan and at 8 to 132 KV splits, both builds, beside fa2 and fa3, decode and chain16 at 1k-16k
# (8 and 64 heads): whether splits shorter than MIN_TOKENS_PER_SPLIT win where contexts are short;
# short-ragged: the same for a ragged batch of four (1k-185k down to a quarter), auto's plan at set
# split counts and beside FlashInfer, then auto as another tree's host code plans it (PLAN_BEFORE:
# that tree's src/, PLAN_BEFORE_REV: its commit, which that run's env.git records; the kernel
# library is this tree's); ragged-v5: v5 and auto forced to 2-16 splits for that batch, chain16
# at 64 heads, 1k-16k, beside FlashInfer (whether v5's 384-token split floor holds there);
# ragged-v5-tree: the same batch as tree64 at 16 heads (2-8 splits) and 64 heads (1-4 splits),
# 4k and 185k (the even split's two waves there: 4 splits and one);
# engine-sm120: the weight GEMMs one by one, then the step anatomy of the custom server and of
# the custom and FlashInfer servers as configured on sm_120, and the custom one on cuBLAS alone;
# engine-pdl: the chained launches' and the tuned GEMMs' GPU tests, then the custom server's step
# anatomy (its kernels folded by layer) plain on cuBLAS, tuned per shape (--gemm auto: cuBLAS or
# the weight-streaming kernel, bmm + rope or the per-head kernel with the rope folded in, the
# silu_mul kernel + cuBLAS or the down GEMM making silu * up as it loads), with
# the other kernels chained by programmatic dependent launch (--gemm cublas-pdl), and with every
# kernel chained (--gemm pdl), its weights prefetched to L2 before each GEMM's wait and not
# (--gemm-prefetch-mb 0; these two at 1k only);
# engine-gemms: every projection at 16 rows alone, cuBLAS, cuBLASLt and each weight-streaming
# configuration launched plainly, then chained with the 16 MB L2 prefetch and without (what the
# chain costs a kernel where nothing overlaps it);
# engine-l2: the side stream's L2 prefetch test, then the custom server's step anatomy without
# it and with 16 MB of each layer's later weights prefetched (--l2-overlap-mb), twice,
# interleaved (an order effect once showed as a gain);
# engine-fused: the folded GEMMs' GPU tests (each fold against the kernels it replaces, the
# folded forward against the unfused one, the fused engine's graphs against its eager tokens),
# then the custom server's step anatomy with cuBLAS, fused and auto, interleaved (FUSED_TESTS=0
# skips the tests; FUSED_RUNS names the GEMM paths to run, in order);
# profile-sm120: Nsight Compute of v5 and v4 in the sm_120-model build at 185k (chain16 and
# tree64, 8 heads): stall reasons, the executed instruction mix, per-instruction counts;
# profile-ragged: the same for v4 (auto's pick there) in this GPU's build on a ragged decode batch
# of four at 185k, 8 and 16 heads, its own plan (splits shared by tokens) beside 132 splits
# (notes/kernel.md, "Profiled, and found to be the bench's warm-up");
# v5-patches: each candidate change of v5 kept as a patch in notes/kernel-v5/ (V5_PATCHES: sets
# of patch names joined by +, "base" for the tree as it is) applied in turn, built, checked
# against float64 and the planted masks in both builds and timed in both builds at 185k
# (chain16, tree64; 8 and 64 heads); the source is restored after each, and no set starts
# past BUDGET_S (give the sets over two calls with V5_PATCHES where one call cannot hold all).
# .whl holds FlashInfer's wheels for the device's Python 3.12, .sgl the part of SGLang's wheel
# the peers read: scripts/gpu_carry.sh makes both.
set -uo pipefail
export DECODECLIFF_GIT_REV=$1
shift
here=$(dirname "$0")
source "$here/gpu_env.sh"
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "commit $DECODECLIFF_GIT_REV"; } | tee "$OUT/env.txt"
el build
mkdir -p results/build && rm -f results/build/*.so  # no earlier call's library stands in
decodecliff build-kernel --arch 90 --require 90 --out results/build --sm120-model 90 > "$OUT/build.log" 2>&1 \
  || tail -3 "$OUT/build.log"
export DECODECLIFF_KERNEL_LIB=$PWD/results/build/libdecodecliff_mla.so
MODEL_LIB=$PWD/results/build/libdecodecliff_mla_sm120model.so
SHIM=$PWD/results/build/libdecodecliff_smem_shim.so  # FlashInfer's dispatch sees sm_120's 100 KB
have_model() { [ -e "$MODEL_LIB" ] || { echo "no sm_120-model library: see $OUT/build.log"; false; }; }
# custom and FlashInfer on the H200's resources and as configured on sm_120 (labels -sm120)
SM="decodecliff bench-kernels --device cuda --backends custom flashinfer --sm120-model
  --flashinfer-backends fa2 fa3 --repeats 20 --max-seconds-per-point 60 --quiet"
EB="decodecliff bench-engine --preset kimi-k2-tp8-rank --device cuda --paths graphs
  --modes chain --draft-len 16 --repeats 5"
KB="decodecliff bench-kernels --device cuda --contexts 1024 16384 65536 185000 --modes decode chain16
  --page-sizes 1 --heads 8 --repeats 20 --triton-config auto --decode-splits sglang
  --index-dtypes int64 int32 --flashinfer-backends fa2 fa3 --max-seconds-per-point 60 --quiet"
# A call returns at most 8 files of $OUT: each part's files are packed into $OUT/parts.tgz as it
# ends (to a new file, then renamed, so a call cut short keeps what finished), and at the end the
# packed files are removed, leaving the tar and env.txt.
# (tar's status 1 is a file that grew as it was read, such as the caller's own log: still packed)
pack() {
  tar -czf "$OUT/.parts.tgz" -C "$OUT" --warning=no-file-changed --exclude=parts.tgz \
    --exclude=.parts.tgz .
  [ $? -le 1 ] && mv "$OUT/.parts.tgz" "$OUT/parts.tgz"
}
for part in "$@"; do
  # BUDGET_S: start no part after this many seconds (a call has 10 minutes; files so far return)
  if [ -n "${BUDGET_S:-}" ] && [ $(( $(date +%s) - T0 )) -gt "$BUDGET_S" ]; then
    echo "skipped $part: past BUDGET_S"; continue
  fi
  el "$part"
  case $part in
    contract) timeout 200 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_backend_contract.py \
        tests/test_peers_fidelity.py > "$OUT/pytest.log" 2>&1; echo "rc $?"; tail -n 2 "$OUT/pytest.log" ;;
    kernels|fidelity)
      backends="triton sglang flashinfer custom"; [ "$part" = fidelity ] && backends="triton sglang"
      timeout 240 $KB --backends $backends --out "$OUT/$part.json" > "$OUT/bench_$part.log" 2>&1
      echo "rc $?"; grep fidelity "$OUT/bench_$part.log" ;;
    engine) timeout 240 decodecliff bench-engine --preset kimi-k2-tp8-rank --device cuda \
        --backends custom sglang flashinfer flashinfer:backend=fa3 --paths graphs \
        --contexts 1024 32768 131072 185000 --modes chain --draft-len 16 --repeats 5 \
        --parts anatomy --out "$OUT/engine.json" > "$OUT/bench_engine.log" 2>&1; echo "rc $?"
      grep -E "step .* ms|failed" "$OUT/bench_engine.log" | tail -n 20 ;;
    sm120)
      have_model || continue
      timeout 150 decodecliff check-kernel --quick --no-timing --variants v4 v5 --seed 1 \
        --out "$OUT/check.json" > "$OUT/check.log" 2>&1; echo "check rc $?"; tail -n 3 "$OUT/check.log"
      DECODECLIFF_KERNEL_LIB=$MODEL_LIB timeout 150 \
        decodecliff check-kernel --quick --no-timing --variants v1 v2 v4 v5 --seed 2 \
        --out "$OUT/check_sm120.json" > "$OUT/check_sm120.log" 2>&1
      echo "check sm120 rc $?"; tail -n 3 "$OUT/check_sm120.log"
      LD_PRELOAD=$SHIM python3 -c "
import ctypes; p = ctypes.CDLL(None); v = ctypes.c_int(); import torch; torch.cuda.init()
for lim in (0, 102400):
    p.dc_set_smem_per_sm(lim); p.cudaDeviceGetAttribute(ctypes.byref(v), 81, 0)
    print('shim limit', lim, '-> smem per SM', v.value)"
      LD_PRELOAD=$SHIM timeout 300 $SM --custom-variants v1 v4 v5 auto \
        --contexts 185000 --modes decode chain16 tree64 --page-sizes 1 --heads 8 16 64 \
        --out "$OUT/sm120.json" > "$OUT/bench_sm120.log" 2>&1; echo "rc $?"
      LD_PRELOAD=$SHIM timeout 120 $SM --custom-variants v1 v4 v5 auto \
        --contexts 185000 --modes chain16 --page-sizes 64 --heads 8 \
        --out "$OUT/sm120_p64.json" > "$OUT/bench_sm120_p64.log" 2>&1; echo "rc $?" ;;
    sm120-more)
      have_model || continue
      MORE="$SM --custom-variants v4 v5 auto --contexts 185000 --page-sizes 1"
      LD_PRELOAD=$SHIM timeout 200 $MORE --modes chain16 decode --heads 8 --batch 4 --ragged \
        --out "$OUT/sm120_ragged.json" > "$OUT/bench_sm120_ragged.log" 2>&1
      echo "rc $?"; grep -E " ok | failed" "$OUT/bench_sm120_ragged.log" ;;
    short-splits)  # the custom kernel at set split counts beside its own plan and FlashInfer
      have_model || continue
      LD_PRELOAD=$SHIM timeout 420 $SM --custom-variants auto v4 v5 \
        --custom-splits 8 16 32 66 132 --contexts 1024 4096 16384 --modes decode chain16 \
        --page-sizes 1 --heads 8 64 --max-seconds-per-point 30 \
        --out "$OUT/short-splits.json" > "$OUT/bench_short-splits.log" 2>&1; echo "rc $?"
      [ -s "$OUT/short-splits.json" ] && python3 "$here/fastest_custom.py" "$OUT/short-splits.json" ;;
    short-ragged)  # ragged batches of four: the plan beside set split counts, FlashInfer, another's
      have_model || continue
      # RAGGED_CONTEXTS, RAGGED_MODES, RAGGED_HEADS, RAGGED_BATCH and RAGGED_SPLITS: another grid
      RAGGED="--contexts ${RAGGED_CONTEXTS:-1024 4096 16384 185000} --modes ${RAGGED_MODES:-decode chain16}
        --page-sizes 1 --heads ${RAGGED_HEADS:-8 64} --batch ${RAGGED_BATCH:-4} --ragged
        --max-seconds-per-point 30"
      LD_PRELOAD=$SHIM timeout 360 $SM --custom-variants auto \
        --custom-splits ${RAGGED_SPLITS:-8 16 32 66 132} \
        $RAGGED --out "$OUT/short-ragged.json" > "$OUT/bench_short-ragged.log" 2>&1; echo "rc $?"
      if [ -n "${PLAN_BEFORE:-}" ]; then  # auto as another tree's host code plans it, same library
        DECODECLIFF_GIT_REV=${PLAN_BEFORE_REV:-$DECODECLIFF_GIT_REV+plan-before} \
        LD_PRELOAD=$SHIM PYTHONPATH=/tmp/site:$PWD/.sgl:$PLAN_BEFORE timeout 180 python3 -m \
          decodecliff.cli ${SM#decodecliff } --backends custom --custom-variants auto $RAGGED \
          --out "$OUT/short-ragged-before.json" > "$OUT/bench_short-ragged-before.log" 2>&1
        echo "rc $?"
      fi
      now=$OUT/short-ragged.json before=$OUT/short-ragged-before.json
      if [ -s "$now" ]; then  # this plan, beside the other tree's where that run wrote points
        python3 "$here/fastest_custom.py" "$now" $([ -s "$before" ] && echo "$before")
      elif [ -s "$before" ]; then python3 "$here/fastest_custom.py" "$before"; fi ;;
    ragged-v5)  # 64 heads of chain16 over a ragged batch: v5 forced at 2-16 splits beside auto's
      have_model || continue
      LD_PRELOAD=$SHIM timeout 240 $SM --custom-variants auto v5 --custom-splits 2 4 8 16 \
        --contexts 1024 4096 16384 --modes chain16 --page-sizes 1 --heads 64 --batch 4 --ragged \
        --max-seconds-per-point 30 --out "$OUT/ragged-v5.json" > "$OUT/bench_ragged-v5.log" 2>&1
      echo "rc $?"
      [ -s "$OUT/ragged-v5.json" ] && python3 "$here/fastest_custom.py" "$OUT/ragged-v5.json" ;;
    ragged-v5-tree)
      have_model || continue
      # tree64: a request's rows are 16 v5 CTAs at 16 heads (two waves: 4 even splits) and 64 at
      # 64 heads (two waves: one split); TREE_HEADS picks the head counts
      for heads in ${TREE_HEADS:-16 64}; do
        splits="2 4 8"; [ "$heads" = 64 ] && splits="1 2 4"
        json=$OUT/ragged-v5-tree-h$heads.json
        LD_PRELOAD=$SHIM timeout 200 $SM --custom-variants auto v5 --custom-splits $splits \
          --contexts 4096 185000 --modes tree64 --page-sizes 1 --heads "$heads" --batch 4 --ragged \
          --max-seconds-per-point 30 --out "$json" > "$OUT/bench_ragged-v5-tree-h$heads.log" 2>&1
        echo "rc $?"
        [ -s "$json" ] && python3 "$here/fastest_custom.py" --splits v5 "$json"
      done ;;
    engine-sm120)
      have_model || continue
      timeout 420 $EB --parts anatomy gemms --contexts 1024 32768 131072 185000 \
        --backends custom custom:model=sm120 flashinfer:model=sm120 \
        --out "$OUT/engine_sm120.json" > "$OUT/bench_engine_sm120.log" 2>&1; echo "rc $?"
      grep -E "step .* ms|failed|gemm" "$OUT/bench_engine_sm120.log" | grep -v "^gemm m=" | tail -n 20
      timeout 120 $EB --parts anatomy --gemm cublas --contexts 1024 185000 --backends custom \
        --out "$OUT/engine_cublas.json" > "$OUT/bench_engine_cublas.log" 2>&1; echo "rc $?"
      grep -E "step .* ms|failed" "$OUT/bench_engine_cublas.log" ;;
    engine-pdl)  # one call: tests (Triton compiles each candidate once), then five steps
      timeout 240 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_engine_gpu.py \
        -k "pdl or chained or folds or rope or auto or tun" > "$OUT/pytest_pdl.log" 2>&1
      echo "tests rc $?"; tail -n 1 "$OUT/pytest_pdl.log"
      for variant in cublas:185000 auto:185000 cublas-pdl:185000 pdl: pdl-prefetch0:; do
        label=${variant%%:*} more=${variant#*:} gemm=${label%-prefetch0}
        [ "$label" = "$gemm" ] || gemm="$gemm --gemm-prefetch-mb 0"
        timeout 90 $EB --parts anatomy --gemm $gemm --contexts 1024 $more --backends custom \
          --out "$OUT/engine_$label.json" > "$OUT/bench_engine_$label.log" 2>&1; echo "$label rc $?"
        grep -E "step .* ms|failed|kernels, span" "$OUT/bench_engine_$label.log"
      done ;;
    engine-gemms)  # a call of its own: every projection alone at 16 rows, three ways
      for variant in cublas:16 pdl:16 pdl:0; do
        gemm=${variant%%:*} mb=${variant#*:}
        timeout 170 $EB --parts gemms --gemm $gemm --gemm-prefetch-mb $mb --tree-nodes 16 \
          --out "$OUT/gemms_${gemm}_$mb.json" > "$OUT/bench_gemms_${gemm}_$mb.log" 2>&1
        echo "$variant rc $?"; grep -E "^gemm step|failed" "$OUT/bench_gemms_${gemm}_$mb.log"
      done ;;
    engine-l2)  # the prefetch branch checked, then none and 16 MB on cuBLAS, twice, interleaved
      timeout 150 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_engine_gpu.py \
        -k "l2_prefetch" > "$OUT/pytest_l2.log" 2>&1
      echo "tests rc $?"; tail -n 1 "$OUT/pytest_l2.log"
      i=0
      for mb in 0 16 0 16; do
        i=$((i + 1)); name=engine_${i}_l2_$mb
        timeout 80 $EB --parts anatomy --gemm cublas --l2-overlap-mb $mb --contexts 1024 185000 \
          --backends custom --out "$OUT/$name.json" > "$OUT/bench_$name.log" 2>&1
        echo "$i: $mb MB rc $?"; grep -E "step .* ms|failed" "$OUT/bench_$name.log"
      done ;;
    engine-fused)  # the folds checked, then cuBLAS and fused twice, interleaved, auto once
      if [ "${FUSED_TESTS:-1}" != 0 ]; then  # a cold Triton cache compiled for over 150 s
        timeout 300 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_engine_gpu.py \
          -k gemm_fold > "$OUT/pytest_fused.log" 2>&1
        echo "tests rc $?"; tail -n 1 "$OUT/pytest_fused.log"
      fi
      i=0
      for gemm in ${FUSED_RUNS:-cublas fused auto cublas fused}; do
        i=$((i + 1)); name=engine_${i}_$gemm
        [ $(( $(date +%s) - T0 )) -gt 480 ] && { echo "skipped $i: $gemm"; continue; }
        timeout 90 $EB --parts anatomy --gemm $gemm --contexts 1024 185000 --backends custom \
          --out "$OUT/$name.json" > "$OUT/bench_$name.log" 2>&1
        echo "$i: $gemm rc $?"; grep -E "step .* ms|failed|kernels, span" "$OUT/bench_$name.log"
      done ;;
    profile-ragged)  # Nsight Compute of v4 on a ragged decode batch: its plan against 132 splits
      OUT=$OUT/profile timeout 400 bash "$here/profile_kernels.sh" v4:185000:1:8:batch=4 \
        v4:185000:1:8:batch=4:splits=132 v4:185000:1:16:batch=4 v4:185000:1:16:batch=4:splits=132 ;;
    profile-sm120)  # Nsight Compute of v5 and v4 as they run on sm_120's per-SM budget
      OUT=$OUT/profile SM120_MODEL=1 timeout 400 bash "$here/profile_kernels.sh" \
        v5:185000:16:8 v4:185000:16:8 v5:185000:64:8:tree ;;
    v5-patches)  # one library per set of patches: build, check both builds, time v5
      cu=src/decodecliff/kernels/csrc/mla_verify.cu
      # every file a patch of V5_PATCHES touches (some change the host code and tests too), kept
      # as sent and put back before each set and however the call ends
      rm -rf /tmp/v5-orig && mkdir -p /tmp/v5-orig
      for name in $(tr '+' ' ' <<< "${V5_PATCHES:-}"); do
        [ "$name" = base ] || sed -n 's|^+++ b/||p' "notes/kernel-v5/v5-$name.patch"
      done | sort -u | while read -r f; do [ -e "$f" ] && cp --parents "$f" /tmp/v5-orig; done
      cp --parents "$cu" /tmp/v5-orig
      trap 'cp -r /tmp/v5-orig/. .' EXIT
      for set in base ${V5_PATCHES:-}; do  # no candidate pending: base alone
        if [ -n "${BUDGET_S:-}" ] && [ $(( $(date +%s) - T0 )) -gt "$BUDGET_S" ]; then
          echo "skipped $set: past BUDGET_S"; continue
        fi
        tag=${set//+/_}
        lib=results/build-$tag
        cp -r /tmp/v5-orig/. .
        for name in ${set//+/ }; do
          [ "$name" = base ] && continue
          change=notes/kernel-v5/v5-$name.patch
          cp "$cu" /tmp/mla_verify.cu.before
          # git apply inside another repository's subdirectory changes nothing and exits 0
          git apply "$change" 2> /dev/null && ! cmp -s "$cu" /tmp/mla_verify.cu.before \
            || patch -s -p1 -N --no-backup-if-mismatch -r - < "$change" \
            || { echo "$set: $name does not apply"; continue 2; }
          cmp -s "$cu" /tmp/mla_verify.cu.before && { echo "$set: $name changed nothing"; continue 2; }
        done
        decodecliff build-kernel --arch 90 --require 90 --out "$lib" --sm120-model 90 \
          > "$OUT/build_$tag.log" 2>&1 || { tail -n 3 "$OUT/build_$tag.log"; continue; }
        grep " v5 " "$OUT/build_$tag.log"
        for build in sm90:libdecodecliff_mla.so sm120:libdecodecliff_mla_sm120model.so; do
          DECODECLIFF_KERNEL_LIB=$PWD/$lib/${build#*:} timeout 100 decodecliff check-kernel --quick \
            --no-timing --variants v5 --seed 3 --out "$OUT/check_${tag}_${build%%:*}.json" \
            > "$OUT/check_${tag}_${build%%:*}.log" 2>&1
          echo "$set ${build%%:*} check rc $?"; tail -n 3 "$OUT/check_${tag}_${build%%:*}.log" | grep v5
        done
        # bench-kernels finds the sm_120-model library beside DECODECLIFF_KERNEL_LIB's
        DECODECLIFF_KERNEL_LIB=$PWD/$lib/libdecodecliff_mla.so timeout 120 decodecliff bench-kernels \
          --device cuda --backends custom --sm120-model --custom-variants v5 --contexts 185000 \
          --modes chain16 tree64 --page-sizes 1 --heads 8 64 --repeats 20 --quiet --out "$OUT/bench_$tag.json" > "$OUT/bench_$tag.log" 2>&1
        echo "$set bench rc $?"; grep -E " ok | failed" "$OUT/bench_$tag.log"
      done
      cp -r /tmp/v5-orig/. .; trap - EXIT ;;
    *) echo "unknown part $part" ;;
  esac
  pack
done
el done
pack && tar -tzf "$OUT/parts.tgz" | grep -v '/$' | grep -vx './env.txt' \
  | (cd "$OUT" && xargs -r rm -f --) && find "$OUT" -mindepth 1 -type d -empty -delete
echo "files of this call: $OUT/parts.tgz (tar -xzf)"
