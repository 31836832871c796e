"""dataset_manifest: the data version of everything the model trains on.

It lists every tokenized partition present with its rows, tokens and content hash, the
tokenizer's hash, the split rule and its counts. Its own hash covers only that canonical
content (never paths, times, artifact ids or Parquet bytes), so the same raw inputs give
the same data version on any machine, and one changed byte of raw text changes it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.data.tables import TOKENS_FILE, iter_batches
from aieng_core.dataset.consistency import staleness
from aieng_core.dataset.split import METHOD, TRAIN, VALIDATION, split_of
from aieng_core.hashing import sha256_json
from aieng_core.store import Artifact, ArtifactNotFound, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.tokenizer.bpe_tokenizer import KIND as TOKENIZER_KIND
from aieng_core.tokenizer.tokenized_documents import KIND as TOKENIZED_KIND

KIND = asset_keys.DATASET_MANIFEST
CODE_VERSION = "dataset_manifest-v1"
DATASET_FILE = "dataset.json"

log = logging.getLogger("aieng.dataset")


class StaleTokenization(RuntimeError):
    """Some partitions were tokenized with a tokenizer, or from clean text, that is no longer current."""


def split_counts(tokens_path: Path, validation_fraction: float, seed: str, batch_rows: int) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for batch in iter_batches(tokens_path, columns=["id", "num_tokens"], batch_rows=batch_rows):
        for doc_id, num_tokens in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            side = split_of(doc_id, validation_fraction, seed)
            counts[f"{side}_rows"] += 1
            counts[f"{side}_tokens"] += num_tokens
    return {
        key: counts.get(key, 0)
        for key in (f"{TRAIN}_rows", f"{TRAIN}_tokens", f"{VALIDATION}_rows", f"{VALIDATION}_tokens")
    }


def build_dataset_manifest(
    store: ArtifactStore, config: AiengConfig, run: RunInfo = RunInfo(), logger: Any = log
) -> Artifact:
    tokenizer = store.require_current(TOKENIZER_KIND)
    partitions = store.current_partitions(TOKENIZED_KIND)
    if not partitions:
        raise ArtifactNotFound("dataset_manifest needs tokenized_documents for at least one partition")
    tokenized = {partition: store.require_current(TOKENIZED_KIND, partition) for partition in partitions}
    stale = {p: why for p, artifact in tokenized.items() if (why := staleness(store, p, artifact, tokenizer.id))}
    if stale:
        first, last = min(stale), max(stale)
        reasons = [why for p in sorted(stale) for why in stale[p]]
        raise StaleTokenization(
            f"partitions {', '.join(sorted(stale))} were not tokenized from the current clean_documents with "
            "the current "
            f"tokenizer ({tokenizer.id}): {'; '.join(reasons[:6])}{'; ...' if len(reasons) > 6 else ''}. "
            "Re-materialize "
            f"tokenized_documents for them, e.g. `dagster asset materialize -m orchestration.definitions "
            f"--select tokenized_documents --partition-range {first}...{last}`"
        )
    spec = ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=config.section_sha256("dataset"),
        inputs=((TOKENIZER_KIND, tokenizer.id), *((TOKENIZED_KIND, tokenized[p].id) for p in partitions)),
    )

    def produce(staging: Path) -> Produced:
        store.check_input(tokenizer)
        for artifact in tokenized.values():
            store.check_input(artifact)
        dataset = config.dataset
        entries = []
        for partition in partitions:
            artifact = tokenized[partition]
            counts = split_counts(
                artifact.file(TOKENS_FILE), dataset.validation_fraction, dataset.split_seed, config.data.batch_rows
            )
            entries.append(
                {
                    "partition": partition,
                    "rows": artifact.metrics["rows"],
                    "tokens": artifact.metrics["tokens"],
                    "sha256": artifact.content_sha256,
                    **counts,
                }
            )
        totals = {key: sum(entry[key] for entry in entries) for key in entries[0] if key not in ("partition", "sha256")}
        content = {
            "partitions": entries,
            "tokenizer_sha256": tokenizer.content_sha256,
            "split": {"method": METHOD, "validation_fraction": dataset.validation_fraction, "seed": dataset.split_seed},
            "totals": totals,
        }
        document = {
            **content,
            "tokenizer_id": tokenizer.id,
            "artifacts": {partition: tokenized[partition].id for partition in partitions},
        }
        (staging / DATASET_FILE).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        logger.info(f"{KIND}: {len(entries)} partitions, {totals['rows']} documents, {totals['tokens']} tokens")
        return Produced(
            content_sha256=sha256_json(content),
            metrics={"partitions": len(entries), **totals},
            extra={"tokenizer_id": tokenizer.id},
        )

    return store.build(spec, produce, run, logger)


def read_dataset(artifact: Artifact) -> dict[str, Any]:
    return json.loads(artifact.file(DATASET_FILE).read_text(encoding="utf-8"))
