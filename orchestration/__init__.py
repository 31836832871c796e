"""The Dagster code location: thin wiring around aieng_core, plus metadata for the UI.

Modules here don't use `from __future__ import annotations`: Dagster inspects the
`context` and resource annotations of asset functions at definition time.
"""

import warnings

import dagster as dg

# BackfillPolicy is marked beta; it is what lets a partition range run from the CLI.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
