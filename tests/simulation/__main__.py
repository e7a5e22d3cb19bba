"""``python -m tests.simulation --seed N [--trace]``: one whole-cluster schedule, replayed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_run import main

sys.exit(main())
