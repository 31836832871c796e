"""Cross-artifact consistency of the tokenized partitions, for the pipeline's checks."""

from __future__ import annotations

from typing import Any

from aieng_core import asset_keys
from aieng_core.store import Artifact, ArtifactStore

CLEAN_KIND = asset_keys.CLEAN_DOCUMENTS
TOKENIZER_KIND = asset_keys.BPE_TOKENIZER
TOKENIZED_KIND = asset_keys.TOKENIZED_DOCUMENTS


def clean_source_ids(tokenized: Artifact) -> list[str]:
    """The clean_documents artifact(s) a tokenized partition was made from."""
    return tokenized.input_ids(CLEAN_KIND)


def staleness(store: ArtifactStore, partition: str, tokenized: Artifact, tokenizer_id: str | None) -> list[str]:
    """Why a tokenized partition was not made from its current clean artifact with the
    current tokenizer; empty when it was."""
    problems = []
    clean = store.current(CLEAN_KIND, partition)
    source_ids = clean_source_ids(tokenized)
    if clean is None or source_ids != [clean.id]:
        problems.append(f"{partition}: tokenized from clean_documents {source_ids}, current is {clean and clean.id}")
    if tokenizer_id is None or tokenized.manifest.get("tokenizer_id") != tokenizer_id:
        problems.append(
            f"{partition}: tokenized with {tokenized.manifest.get('tokenizer_id')}, current tokenizer is {tokenizer_id}"
        )
    return problems


def tokenized_consistency(store: ArtifactStore) -> dict[str, Any]:
    """Every tokenized partition has one row per clean row of the same partition and was
    made from it with the current tokenizer."""
    tokenizer = store.current(TOKENIZER_KIND)
    problems = []
    partitions = store.current_partitions(TOKENIZED_KIND)
    for partition in partitions:
        tokenized = store.require_current(TOKENIZED_KIND, partition)
        clean = store.require_current(CLEAN_KIND, partition)
        problems.extend(staleness(store, partition, tokenized, tokenizer.id if tokenizer else None))
        if clean_source_ids(tokenized) == [clean.id] and tokenized.metrics["rows"] != clean.metrics["rows_clean"]:
            problems.append(
                f"{partition}: {tokenized.metrics['rows']} tokenized rows for {clean.metrics['rows_clean']} clean rows"
            )
    return {"passed": not problems, "partitions": partitions, "problems": problems}
