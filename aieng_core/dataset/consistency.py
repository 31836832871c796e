"""Cross-artifact consistency of the tokenized partitions, for the pipeline's checks."""

from __future__ import annotations

from typing import Any

from aieng_core.data.clean_documents import KIND as CLEAN_KIND
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.bpe_tokenizer import KIND as TOKENIZER_KIND
from aieng_core.tokenizer.tokenized_documents import KIND as TOKENIZED_KIND


def tokenized_consistency(store: ArtifactStore) -> dict[str, Any]:
    """Every tokenized partition has one row per clean row of the same partition and was
    made with the current tokenizer."""
    tokenizer = store.current(TOKENIZER_KIND)
    problems = []
    partitions = store.current_partitions(TOKENIZED_KIND)
    for partition in partitions:
        tokenized = store.require_current(TOKENIZED_KIND, partition)
        clean = store.require_current(CLEAN_KIND, partition)
        source_ids = [item["id"] for item in tokenized.manifest["inputs"] if item["kind"] == CLEAN_KIND]
        if source_ids != [clean.id]:
            problems.append(f"{partition}: tokenized from clean_documents {source_ids}, current is {clean.id}")
        elif tokenized.metrics["rows"] != clean.metrics["rows_clean"]:
            problems.append(f"{partition}: {tokenized.metrics['rows']} tokenized rows for {clean.metrics['rows_clean']} clean rows")
        if tokenizer is None or tokenized.manifest.get("tokenizer_id") != tokenizer.id:
            problems.append(f"{partition}: tokenized with {tokenized.manifest.get('tokenizer_id')}, current tokenizer is {tokenizer and tokenizer.id}")
    return {"passed": not problems, "partitions": partitions, "problems": problems}
