"""Hypothesis profiles: ``make test`` runs each property with a fixed seed, ``make explore`` with
fresh random examples (and more of them) to look for new failing cases.

A fixed seed makes a run's verdict depend on the code alone; a failing example found while
exploring is kept in the example database and becomes an explicit test.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", max_examples=1_000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
