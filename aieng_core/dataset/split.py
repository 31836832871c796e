"""A deterministic train/validation split by document id.

A document's side depends only on its id and the seed, never on order, date or machine,
so a document never moves between train and validation as new days arrive.
"""

from __future__ import annotations

import hashlib

TRAIN = "train"
VALIDATION = "validation"
METHOD = "sha256(seed + NUL + id)[:8] as a fraction of 2**64 < validation_fraction"


def split_of(doc_id: str, validation_fraction: float, seed: str) -> str:
    digest = hashlib.sha256(f"{seed}\0{doc_id}".encode()).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    return VALIDATION if position < validation_fraction else TRAIN
