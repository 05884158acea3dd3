#!/usr/bin/env bash
# Publish a GPU study: render raw results measured on a GPU machine with the pipeline's own
# analysis rules, and write raw + summaries + executed notebooks + report into one folder.
#
#   scripts/publish_study.sh CONFIG DEST RAW_DIR [RAW_DIR ...]
#   scripts/publish_study.sh config/h200.yaml results/published/h200 results/runs/h200/05f0426
#   scripts/publish_study.sh config/h200.yaml:config/h100.yaml results/published/h100 RAW_DIR...
#
# CONFIG: a config file, or several joined by ':' (each overlaying the ones before it, as
# snakemake's --configfile takes them: config/h100.yaml is the H200 study measured on an H100).
#
# Each RAW_DIR is laid out as the pipeline writes under results/: build/build.json,
# kernels/bench.json, sweep/<server>/ctx<N>.json (plus engine/*.json and the publisher's README.md
# of how it ran, and its gpu-logs/). A study measured in several runs (by server, at different
# commits) gives one RAW_DIR per run; they are merged, and a result file that two runs both hold is
# an error, not an override; runs measured on two GPUs, or on another than the config's study.gpu
# names, are no study of it and stop the publication. A run's README.md and gpu-logs/ are its
# record, not results: one run's are published as the study's (DEST/README.md, DEST/gpu-logs/);
# with several runs, each run's go to DEST/gpu-logs/<run folder name>/ and DEST/README.md is left
# to be written by hand (as it is where the one run brings none: both say so).
# DEST/gpu-logs/ is hand-kept: a run's file that would replace a different one there stops the
# publication before any work. Nothing is measured here: the raw files are marked up to date
# (`snakemake --touch`) and only the summaries, notebooks, report and NOTES.md are computed, on
# this machine. NOTES.md is rendered by the `notes` rule from the result files
# (workflow/report/notes.md.j2); one in a RAW_DIR is dropped, so no typed number is published.
# RUNS.md lists what each RAW_DIR held (commit, when, points and their status: `python -m
# decodecliff.study.runs record`), read from its files, each under its path relative to the
# repository's root however it was typed, for the hand-written README.md beside it. FlashInfer's
# sm_120 build check is computed here too (nvcc, no GPU): install flashinfer-python and
# apache-tvm-ffi (`--no-deps`, see the `peers` extra) first, or it is published as skipped.
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
# Each run's record (README.md, gpu-logs/): where it goes in DEST. One run's stands as the
# study's, as RUNS.md and the published README expect; several runs' each keep their own folder,
# so no run's record silently replaces another's and each says which run it came from.
prov_src=() prov_dst=()
if [ $# -gt 1 ]; then
  dup=$(for raw in "$@"; do basename "$(realpath "$raw")"; done | sort | uniq -d)
  [ -z "$dup" ] || fail "two runs share the folder name $dup: their gpu-logs/$dup/ would clash"
fi
for raw in "$@"; do
  abs=$(realpath "$raw")
  if [ $# -eq 1 ]; then to_readme=README.md to_logs=gpu-logs
  else to_readme=gpu-logs/$(basename "$abs")/README.md to_logs=gpu-logs/$(basename "$abs"); fi
  if [ -f "$abs/README.md" ]; then prov_src+=("$abs/README.md") prov_dst+=("$to_readme"); fi
  if [ -d "$abs/gpu-logs" ]; then
    while IFS= read -r -d '' f; do
      prov_src+=("$f") prov_dst+=("$to_logs/${f#"$abs/gpu-logs/"}")
    done < <(find "$abs/gpu-logs" -type f -print0 | sort -z)
  fi
done
dup=$(printf '%s\n' ${prov_dst[@]+"${prov_dst[@]}"} | sort | uniq -d)
[ -z "$dup" ] || fail "two of a run's files would be published as $dup"
for i in ${prov_src[@]+"${!prov_src[@]}"}; do
  kept="$dest/${prov_dst[$i]}"
  if [ -e "$kept" ] && ! cmp -s "${prov_src[$i]}" "$kept"; then
    fail "$kept (hand-kept) differs from ${prov_src[$i]}, which would replace it: move one first"
  fi
done
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
build_json=$(mktemp)
trap 'rm -rf "$work" "$build_json"' EXIT

cp -r "$repo"/{Snakefile,config.yaml,workflow,notebooks,config,data,envs,profiles} "$work"/
mkdir -p "$work/results"
python3 -m decodecliff.study.runs record --root "$repo" "$@" > "$work/RUNS.md"
for raw in "$@"; do
  # the run's own record is no result: published beside them (above), not merged into them
  clash=$(cd "$raw" && find . -type f ! -path ./README.md ! -path './gpu-logs/*' |
    while read -r f; do if [ -e "$work/results/$f" ]; then echo "${f#./}"; fi; done)
  [ -z "$clash" ] || { echo "in two runs (last: $raw): $clash" >&2; exit 1; }
  tar -C "$raw" --exclude ./README.md --exclude ./gpu-logs -cf - . | tar -C "$work/results" -xf -
done
rm -f "$work/results/NOTES.md"
cut=$(python3 -c 'import sys; from pathlib import Path; from decodecliff.study.runs import cut_benches
print(" ".join(cut_benches(Path(sys.argv[1]))))' "$work/results")
[ -z "$cut" ] || fail "a bench the runs hold did not finish (measure it again): $cut"
# one GPU's measurements, the one the config names (config/h200.yaml over an H100's runs is no
# H200 study): the config's files merged as snakemake merges them, config.yaml first
mismatch=$(python3 -c 'import sys; from pathlib import Path
from decodecliff.study.config import merged; from decodecliff.study.runs import gpu_mismatch
cfg = merged(sys.argv[2:])
print(gpu_mismatch(Path(sys.argv[1]), (cfg.get("study") or {}).get("gpu")) or "")' \
  "$work/results" "$repo/config.yaml" "${cfg[@]}")
[ -z "$mismatch" ] || fail "$mismatch"
cd "$work"
[ -f results/build/build.json ] || fail "no run holds build/build.json, the GPU machine's record of its build"
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
for i in ${prov_src[@]+"${!prov_src[@]}"}; do
  mkdir -p "$(dirname "$dest/${prov_dst[$i]}")"
  cp -p "${prov_src[$i]}" "$dest/${prov_dst[$i]}"
done
if [ $# -gt 1 ]; then
  echo "several runs: each run's README.md and gpu-logs/ are in $dest/gpu-logs/<run>/;" \
    "write $dest/README.md (how the study was measured) by hand" >&2
elif [ ! -f "$dest/README.md" ]; then  # the study's README, which RUNS.md stands beside
  echo "$1 holds no README.md: write $dest/README.md (how the study was measured) by hand" >&2
fi
echo "published $(find "$dest" -type f | wc -l) files to $dest"
