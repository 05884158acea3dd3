#!/bin/bash
# Measure study points on the GPU machine with the pipeline's own commands.
#
#   run_points.sh COMMIT SERVER:CTX [SERVER:CTX ...]
#
# points.txt holds the `sweep_point` rule's shell command for every point of config/h200.yaml,
# printed by `snakemake -n -p --configfile config/h200.yaml` and changed only in where files go
# (results/sweep/<server> -> $W/<server>, the rule's log -> $W/<server>-ctx<N>.log). One server
# launch per point, as in the pipeline. The work folder is packed into $OUT/study.tar after every
# point, so what finished comes back even if the call is cut short.
set -uo pipefail
here=$(dirname "$0")
export DECODECLIFF_GIT_REV=$1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
shift
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodecliff.cli "$@"\n' > /tmp/bin/decodecliff
chmod +x /tmp/bin/decodecliff && export PATH=/tmp/bin:$PATH
W=/tmp/study && mkdir -p $W
T0=$(date +%s); el() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
echo "commit $DECODECLIFF_GIT_REV"
# only the custom servers load the kernel library
if [[ " $* " == *" custom"* && ! -f build/kernels/libdecodecliff_mla.so ]]; then
  el build-kernel
  decodecliff build-kernel --arch 90 --require 90 --out build/kernels > $W/build.log 2>&1 || { tail $W/build.log; exit 1; }
fi
for point in "$@"; do
  server=${point%%:*} ctx=${point##*:}
  cmd=$(grep -- "--name $server --contexts $ctx " "$here/points.txt") || { echo "no command for $point"; continue; }
  el "$server ctx $ctx"
  (eval "$cmd")
  echo "rc $?"; tail -n 2 "$W/$server-ctx$ctx.log"
  tar -C $W -cf "$OUT/study.tar" .
done
el done
