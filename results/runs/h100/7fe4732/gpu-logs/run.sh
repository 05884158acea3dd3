#!/bin/bash
# One device call meant for the H200 study at 7fe4732 (results/runs/h200/7fe4732) that was lent
# an NVIDIA H100: its two points (triton-graph-p1 and custom-graph-p1 at 185k) are kept here, in
# study/ as the rules wrote them, and are part of no study (the merge refuses another GPU's
# points; scripts/gpu_study_run.sh now stops before any work under REQUIRE_GPU=H200). From the
# repository root of 7fe4732, carry .whl .sgl .run:
# .run/: scripts/gpu_study_run.sh and scripts/gpu_env.sh of 70e9975
BUDGET_S=420 bash .run/gpu_study_run.sh 7fe4732 scripts/study-h200.txt triton-graph-p1:185000 \
  custom-graph-p1:185000
