"""`python -m aieng_core.cli`: the `aieng` command (the gate and the benchmarks start servers so)."""

import sys

from aieng_core.cli import main

sys.exit(main())
