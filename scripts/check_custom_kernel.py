"""`decodecliff check-kernel` under its former path, which the published study's README names."""

import sys

from decodecliff.bench.check_kernel import cli

sys.exit(cli(sys.argv[1:]))
