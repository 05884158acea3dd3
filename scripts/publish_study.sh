#!/usr/bin/env bash
# Publish a GPU study: render raw results measured on a GPU machine with the pipeline's own
# analysis rules, and write raw + summaries + executed notebooks + report into one folder.
#
#   scripts/publish_study.sh CONFIG DEST RAW_DIR [RAW_DIR ...]
#   scripts/publish_study.sh config/h200.yaml results/published/h200 results/runs/h200/*/
#   scripts/publish_study.sh config/h200.yaml:config/h100.yaml results/published/h100 RAW_DIR...
#
# CONFIG: a config file, or several joined by ':' (each overlaying the ones before it, as
# snakemake's --configfile takes them: config/h100.yaml is the H200 study measured on an H100).
#
# Each RAW_DIR is laid out as the pipeline writes under results/: build/build.json,
# kernels/bench.json, sweep/<server>/ctx<N>.json (plus engine/*.json and the publisher's README.md
# of how it ran). A study measured in several runs (by server, at different commits) gives one
# RAW_DIR per run; they are merged, and a file that two runs both hold is an error, not an
# override. Nothing is measured here: the raw files are marked up to date (`snakemake --touch`)
# and only the summaries, notebooks, report and NOTES.md are computed, on this machine. NOTES.md
# is rendered by the `notes` rule from the result files (workflow/report/notes.md.j2); one in a
# RAW_DIR is dropped, so no typed number is published. RUNS.md lists what each RAW_DIR held
# (commit, when, points and their status: `python -m decodecliff.study.runs describe`), read from
# its files, for the hand-written README.md beside it. FlashInfer's sm_120 build check is
# computed here too (nvcc, no GPU): install flashinfer-python and apache-tvm-ffi (`--no-deps`, see
# the `peers` extra) first, or it is published as skipped.
set -euo pipefail
usage() { echo "usage: $0 CONFIG DEST RAW_DIR [RAW_DIR ...]" >&2; exit 2; }
fail() { echo "$0: $*" >&2; exit 2; }
[ $# -ge 3 ] && [ "$1" != -h ] && [ "$1" != --help ] || usage
IFS=: read -ra cfgs <<< "$1"
[ ${#cfgs[@]} -gt 0 ] && [[ $1 != *$'\n'* ]] || usage
for c in "${cfgs[@]}"; do [ -f "$c" ] || fail "no config file $c"; done
for raw in "${@:3}"; do [ -d "$raw" ] || fail "no run folder $raw"; done
# a publication is whole: DEST holds nothing of an earlier one (its gpu-logs/ stay, hand-kept)
if [ -d "$2" ] && [ -n "$(ls -A "$2" | grep -vx gpu-logs)" ]; then
  fail "$2 holds an earlier publication's files: remove all but gpu-logs/ first"
fi
cfg=() dest=$(realpath -m "$2")
for c in "${cfgs[@]}"; do cfg+=("$(realpath "$c")"); done
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
build_json=$(mktemp)
trap 'rm -rf "$work" "$build_json"' EXIT

cp -r "$repo"/{Snakefile,config.yaml,workflow,notebooks,config,data,envs,profiles} "$work"/
mkdir -p "$work/results"
{ echo "# What each run held (generated from its files by publish_study.sh)"
  for raw in "$@"; do printf '\n## `%s`\n\n' "$raw"; python3 -m decodecliff.study.runs describe "$raw"; done
} > "$work/RUNS.md"
for raw in "$@"; do
  clash=$(cd "$raw" && find . -type f | while read -r f; do
    if [ -e "$work/results/$f" ]; then echo "${f#./}"; fi
  done)
  [ -z "$clash" ] || { echo "in two runs (last: $raw): $clash" >&2; exit 1; }
  cp -r "$raw"/. "$work/results/"
done
rm -f "$work/results/NOTES.md"
cd "$work"
cp results/build/build.json "$build_json"
decodecliff build-kernel --out results/build > /dev/null  # the library the rules name as input
cp "$build_json" results/build/build.json  # keep the GPU machine's record of its build
# the measured files count as up to date; only what is computed from them runs here
# (of the build, its record: the sm_120 model's JSON beside it is no rule's output)
measured=$(find results/build/build.json results/kernels results/engine results/sweep -name '*.json' 2> /dev/null || true)
snakemake --cores 1 --configfile "${cfg[@]}" --config published=null --touch $measured
# a measurement the runs lack stops the publication (missing input) instead of running here
measuring='^(build_kernel|bench_kernels|bench_engine|sweep_point)$'
snakemake --cores 2 --configfile "${cfg[@]}" --config published=null \
  --allowed-rules $(snakemake --list-rules --configfile "${cfg[@]}" | grep -vE "$measuring")

mkdir -p "$dest"
cp RUNS.md "$dest/"
tar -C results --exclude '*.so' --exclude ./logs --exclude ./benchmarks --exclude ./build/ptxas.log \
  -cf - . | tar -C "$dest" -xf -
echo "published $(find "$dest" -type f | wc -l) files to $dest"
