# Sourced by the scripts that run on a lent GPU machine (its own Python, torch and Triton; no
# network): FlashInfer's wheels from .whl installed without dependencies, the part of SGLang's
# wheel the peers read (.sgl) and this tree's src/ on the path, and a `decodecliff` command.
# Carry: .whl .sgl (made by scripts/gpu_carry.sh, which says what they hold).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/.sgl:$PWD/src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m decodecliff.cli "$@"\n' > /tmp/bin/decodecliff
chmod +x /tmp/bin/decodecliff && export PATH=/tmp/bin:$PATH
