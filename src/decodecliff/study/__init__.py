"""The study's configuration: what `snakemake` runs, computed from config.yaml (and presets).

The workflow (Snakefile, workflow/rules/*.smk) only declares rules; everything it computes from
the config lives here, so it is tested without Snakemake:

- ``config``: load the YAML files, validate them against the schema (defaults filled in from the
  schema itself) and check what a schema cannot express, naming the offending key;
- ``servers``: one server entry's launch command, KV pool and whether it can run here;
- ``plan``: the study's points, their chunks and per-job settings, the benches' flags;
- ``notebooks``: the analysis notebooks, their inputs and papermill parameters;
- ``paths``: where each stage's files land.
"""
