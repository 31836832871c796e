"""An empty day's mark on its artifacts: what raw_documents says of a partition's landing
folder, and whether a raw, clean or tokenized artifact holds nothing.

Kept apart from raw_documents.py (which needs the config and the readers) so that what only
reads a manifest, `aieng lineage` at 3 a.m. included, imports nothing heavy.
"""

from __future__ import annotations

from aieng_core.store import Artifact

# What the manifest says of a partition's landing folder.
LANDED, EMPTY, ABSENT = "landed", "empty", "absent"


def has_no_data(artifact: Artifact) -> bool:
    """Whether a raw, clean or tokenized partition artifact holds nothing (an empty day).
    Manifests written before empty days existed always held data."""
    return bool(artifact.metrics.get("no_data", False))
