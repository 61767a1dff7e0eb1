"""python -m bench.sim ARGS (the same as `lengthwise sim ARGS`)."""

import sys

from bench.sim.cli import main

sys.exit(main(sys.argv[1:]))
