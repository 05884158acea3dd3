#!/bin/bash
# Measure part of a GPU study on a lent GPU machine, with the pipeline rules' own commands:
#
#   scripts/gpu_study_run.sh COMMIT COMMANDS KEY [KEY ...]            (carry: .whl .sgl)
#
# COMMANDS: a file of scripts/study_commands.py (scripts/study-h200.txt); KEY: build_kernel,
# bench_kernels, bench_engine or SERVER:CTX (one sweep point: one server launch). Each command runs
# in the tree's root and writes under results/ as the rule would (its log in results/logs/); the
# kernel library is built first by the study's rule unless this call's machine built it so for
# this commit. After every key, what the rules wrote (less the libraries) is packed into
# $OUT/study.tar, so what a call measured comes back even if it is cut short. The call's clock
# starts before its set-up. BUDGET_S: start no key after this many seconds. CALL_S (560): a key
# still running then is stopped (SIGTERM: the sweep records its point failed and stops its
# server) and packed, before the device call's own limit of 600 s would lose it. A key given
# twice runs once, one with two lines in COMMANDS not at all; a point this machine measured at
# this commit already is not measured again.
# Exit status: 0 when every key gave its result, 4 when a key failed, was stopped or was not
# started (each named at the end), 3 for another GPU than REQUIRE_GPU, 1 for a failed build.
# REQUIRE_GPU=H200:
# stop before any work unless the GPU's name holds it (a lease may lend another GPU, and a run's
# points are of one: the merge refuses another's, after the call has spent its time). GPUS=N (a host
# of N GPUs): N workers, one per GPU (CUDA_VISIBLE_DEVICES), take the keys in the order given,
# each key on one GPU alone, so list the longest first; each worker's output is prefixed with
# its GPU. A study too long for one lease is measured so in several calls and leases at one
# commit: each call's tar merged into one run folder (python -m decodecliff.study.runs merge), which
# publish_study.sh publishes.
set -uo pipefail
T0=$(date +%s)
CALL_S=${CALL_S:-560}
export DECODECLIFF_GIT_REV=$1
commands=$2
shift 2
source "$(dirname "$0")/gpu_env.sh"
el() { echo "== $(($(date +%s) - T0)) s: $*"; }
left() { echo $((CALL_S - ($(date +%s) - T0))); }
command_of() { awk -F'\t' -v k="$1" '$1 == k { print $2 }' "$commands"; }
run_key() {
  local cmd log rc limit
  cmd=$(command_of "$1")
  [ -n "$cmd" ] || { echo "no command for $1 in $commands"; return 1; }
  if [[ $cmd == *$'\n'* ]]; then  # a key of two lines in the file (one appended again)
    echo "$(wc -l <<< "$cmd") commands for $1 in $commands: none run"
    return 1
  fi
  log=$(grep -oE '> results/logs/[^ ]+' <<< "$cmd" | tail -n 1)
  log=${log#> }
  mkdir -p "$(dirname "$log")"
  limit=$(left)
  timeout --kill-after=20 "$((limit > 1 ? limit : 1))" bash -c "$cmd"  # 0 would be no limit
  rc=$?
  [ $rc = 124 ] || [ $rc = 137 ] && echo "$1: stopped at CALL_S ($CALL_S s)"
  echo "$1: rc $rc"
  tail -n 2 "$log"
  return $rc
}
measured() {  # whether key SERVER:CTX's point file holds its result (status ok or skipped)
  [[ $1 == *:* ]] || return 1
  python3 -c 'import json, sys
try:
    sys.exit(json.load(open(sys.argv[1])).get("status") not in ("ok", "skipped"))
except (OSError, ValueError, AttributeError):
    sys.exit(1)' "results/sweep/${1%%:*}/ctx${1##*:}.json"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit $DECODECLIFF_GIT_REV"; } | tee "$OUT/env.txt"
gpu=$(head -n 1 "$OUT/env.txt")
if [ -n "${REQUIRE_GPU:-}" ] && [[ "$gpu" != *"$REQUIRE_GPU"* ]]; then
  echo "the lent GPU is not an $REQUIRE_GPU (REQUIRE_GPU): nothing measured"
  exit 3
fi
# The study's rule builds the library once per commit on this machine (a warm machine keeps an
# earlier call's files: another commit's are cleared, a library built otherwise is not used).
built="results/build/.built-by-rule-$DECODECLIFF_GIT_REV"
if [ ! -e "$built" ]; then
  rm -rf results/{build,kernels,engine,sweep,logs}
  el build_kernel
  run_key build_kernel || { echo "the kernel build failed: nothing measured"; exit 1; }
  touch "$built"
fi
queue=$(mktemp) lock=$(mktemp) unfinished=$(mktemp)
printf '%s\n' "$@" | awk '!seen[$0]++' > "$queue"
next_key() { flock "$lock" sh -c 'head -n 1 "$1" && sed -i 1d "$1"' _ "$queue"; }
# to a new file, then renamed: a call cut short mid-pack keeps the previous tar (tar's status 1:
# a file another worker wrote as it was read, packed as read; its temporary files are left out)
pack() {
  flock "$lock" sh -c 'cd results && tar --exclude "*.so" --exclude "*.tmp" \
    --warning=no-file-changed -cf "$1.new" $(ls -d build kernels engine sweep logs 2> /dev/null)
    [ $? -le 1 ] && mv "$1.new" "$1"' _ "$OUT/study.tar"
}
worker() {
  local key
  while key=$(next_key) && [ -n "$key" ]; do
    [ "$key" = build_kernel ] && continue
    if measured "$key"; then
      echo "$key: measured on this machine already"
      continue
    fi
    if [ -n "${BUDGET_S:-}" ] && [ $(($(date +%s) - T0)) -gt "$BUDGET_S" ] || [ "$(left)" -lt 10 ]; then
      echo "skipped $key: past BUDGET_S or CALL_S"
      echo "$key" >> "$unfinished"
      continue
    fi
    el "$key (GPU ${CUDA_VISIBLE_DEVICES:-all})"
    if ! run_key "$key" || { [[ $key == *:* ]] && ! measured "$key"; }; then
      echo "$key" >> "$unfinished"
    fi
    pack
  done
}
pack  # the build's record, whatever follows
for gpu in $(seq 0 $((${GPUS:-1} - 1))); do
  if [ "${GPUS:-1}" -gt 1 ]; then
    CUDA_VISIBLE_DEVICES=$gpu worker 2>&1 | sed -u "s/^/[gpu $gpu] /" &
  else
    worker
  fi
done
wait
el done
if [ -s "$unfinished" ]; then
  echo "not measured: $(sort -u "$unfinished" | paste -sd " ")"
  exit 4
fi
