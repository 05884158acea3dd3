#!/usr/bin/env bash
# Publish a GPU study: render raw results measured on a GPU machine with the pipeline's own
# analysis rules, and write raw + summaries + executed notebooks + report into one folder.
#
#   scripts/publish_study.sh RAW_DIR CONFIG DEST
#   scripts/publish_study.sh /tmp/h200-raw config/h200.yaml results/published/h200
#
# RAW_DIR is laid out as the pipeline writes under results/: build/build.json, kernels/bench.json,
# sweep/<server>/ctx<N>.json (plus engine/*.json and the publisher's README.md of how it ran).
# Nothing is measured here: the raw files are marked up to date (`snakemake --touch`) and only the
# summaries, notebooks, report and NOTES.md are computed, on this machine. NOTES.md is rendered
# by the `notes` rule from the result files (workflow/report/notes.md.j2); one in RAW_DIR is
# dropped, so no typed number is published.
set -euo pipefail
raw=$(realpath "$1") cfg=$2 dest=$3
repo=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cp -r "$repo"/{Snakefile,config.yaml,workflow,notebooks,config,data,envs,profiles} "$work"/
mkdir -p "$work/results"
cp -r "$raw"/. "$work/results/"
rm -f "$work/results/NOTES.md"
cd "$work"
build_json=$(mktemp) && cp results/build/build.json "$build_json"
decodecliff build-kernel --out results/build > /dev/null  # the library the rules name as input
cp "$build_json" results/build/build.json  # keep the GPU machine's record of its build
# the measured files count as up to date; only what is computed from them runs here
snakemake --cores 1 --configfile "$repo/$cfg" --config published=null --touch \
  results/build/build.json results/kernels/bench.json $(cd results && ls sweep/*/ctx*.json | sed 's|^|results/|')
snakemake --cores 2 --configfile "$repo/$cfg" --config published=null

mkdir -p "$repo/$dest"
rsync -a --exclude '*.so' --exclude '/logs/' --exclude '/benchmarks/' --exclude '/build/ptxas.log' results/ "$repo/$dest/"
echo "published $(find "$repo/$dest" -type f | wc -l) files to $dest"
