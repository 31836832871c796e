"""bpe_tokenizer: the artifact, trained on the clean text of every partition present.

The tokenizer is pinned: once trained, it stays current while its config section and code
version are unchanged, so a new day's partition neither forces a new tokenizer nor
re-tokenizing old partitions (which would change every token id the model ever saw).
It is retrained when the config or code version changes, or when asked (`retrain=True`);
a retrain over unchanged inputs finds the identical artifact and reuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.data.empty_day import has_no_data
from aieng_core.data.tables import CLEAN_FILE, iter_batches
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.progress import Progress
from aieng_core.store import Artifact, ArtifactNotFound, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.store.file_lock import exclusive_lock
from aieng_core.tokenizer.bpe import (
    TOKENIZER_FILES,
    capped,
    load_tokenizer,
    round_trip_misses,
    save_tokenizer_dir,
    train_bpe,
)

CLEAN_KIND = asset_keys.CLEAN_DOCUMENTS

KIND = asset_keys.BPE_TOKENIZER
# v2: tokenizer_config.json sets split_special_tokens (special-token text in documents stays text).
CODE_VERSION = "bpe_tokenizer-v2"

log = logging.getLogger("aieng.tokenizer")


def clean_texts(artifacts: list[Artifact], batch_rows: int) -> Iterator[str]:
    """Clean text of the given clean_documents artifacts, streamed in record batches."""
    for artifact in artifacts:
        for batch in iter_batches(artifact.file(CLEAN_FILE), columns=["text"], batch_rows=batch_rows):
            yield from batch.column(0).to_pylist()


def round_trip_report(store: ArtifactStore, batch_rows: int, examples: int = 5) -> dict[str, Any]:
    """Every clean row of every current clean_documents partition, encoded with the current
    tokenizer as tokenized_documents encodes it, must decode back to itself without a single
    special id (see round_trip_misses). Streams record batches, so memory stays bounded.

    Returns passed, partitions, texts_checked, failures and up to `examples` failing rows
    as "partition/id".
    """
    tokenizer = load_tokenizer(store.require_current(KIND).path)
    partitions = store.current_partitions(CLEAN_KIND)
    texts_checked = failures = 0
    failing_ids: list[str] = []
    for partition in partitions:
        clean = store.require_current(CLEAN_KIND, partition)
        for batch in iter_batches(clean.file(CLEAN_FILE), columns=["id", "text"], batch_rows=batch_rows):
            texts = batch.column(1).to_pylist()
            misses = round_trip_misses(tokenizer, texts)
            texts_checked += len(texts)
            failures += len(misses)
            ids = batch.column(0)
            failing_ids += [f"{partition}/{ids[i].as_py()}" for i in misses[: max(0, examples - len(failing_ids))]]
    return {
        "passed": texts_checked > 0 and failures == 0,
        "partitions": partitions,
        "texts_checked": texts_checked,
        "failures": failures,
        "failing_ids": failing_ids,
    }


class NoCleanText(ArtifactNotFound):
    """No current clean_documents partition holds any text (none ingested, or only empty days)."""


def _pinned(store: ArtifactStore, config_sha256: str) -> Artifact | None:
    """The current tokenizer, if it was made by this code version and config."""
    current = store.current(KIND)
    if current is None:
        return None
    if current.manifest.get("code_version") != CODE_VERSION or current.manifest.get("config_sha256") != config_sha256:
        return None
    return current


def build_bpe_tokenizer(
    store: ArtifactStore, config: AiengConfig, retrain: bool = False, run: RunInfo = RunInfo(), logger: Any = log
) -> Artifact:
    """The pinned tokenizer, else one trained now. One build at a time, the pin looked up once
    the lock is held: ingest runs of several days started together (the landing sensor does)
    all get the first one's tokenizer instead of each training its own."""
    with exclusive_lock(
        store.home / "work" / "locks" / f"{KIND}.lock",
        on_wait=lambda: logger.info(f"{KIND}: waiting for another build of the tokenizer to finish"),
    ):
        return _build_bpe_tokenizer(store, config, retrain, run, logger)


def _build_bpe_tokenizer(
    store: ArtifactStore, config: AiengConfig, retrain: bool, run: RunInfo, logger: Any
) -> Artifact:
    config_sha256 = config.section_sha256("tokenizer")
    pinned = None if retrain else _pinned(store, config_sha256)
    if pinned is not None and not store.verify(pinned):
        return Artifact(pinned.kind, pinned.id, pinned.path, pinned.manifest, reused=True)
    if pinned is not None:
        # Damaged: rebuild the very same recipe (the clean artifacts it was trained on), so the
        # id every tokenized partition names stays valid; store.build moves the damaged copy aside.
        logger.warning(f"{KIND}: pinned tokenizer {pinned.id} is damaged; retraining it from its own inputs")
        cleaned = [store.get(item["kind"], item["id"]) for item in pinned.manifest["inputs"]]
        partitions = [artifact.manifest["partition"] for artifact in cleaned]
    else:
        # Empty days add nothing to learn from; leaving them out keeps the recipe what it was.
        cleaned = [
            artifact
            for partition in store.current_partitions(CLEAN_KIND)
            if not has_no_data(artifact := store.require_current(CLEAN_KIND, partition))
        ]
        if not cleaned:
            raise NoCleanText(
                "bpe_tokenizer needs clean text: materialize clean_documents for at least one partition with data first"
            )
        partitions = [artifact.manifest["partition"] for artifact in cleaned]
    spec = ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=config_sha256,
        config_sections=config.section_values("tokenizer"),
        inputs=tuple((CLEAN_KIND, artifact.id) for artifact in cleaned),
    )
    total_chars = sum(artifact.metrics["chars_clean"] for artifact in cleaned)
    train_chars = min(total_chars, config.tokenizer.max_training_chars)

    def produce(staging: Path) -> Produced:
        progress = Progress(logger, KIND)
        progress.update(
            f"training a {config.tokenizer.vocab_size}-token BPE on {train_chars:,} characters from "
            f"{len(partitions)} partitions",
            force=True,
        )
        for artifact in cleaned:
            store.check_input(artifact)
        texts = capped(clean_texts(cleaned, config.data.batch_rows), config.tokenizer.max_training_chars)
        tokenizer = train_bpe(texts, config.tokenizer)
        save_tokenizer_dir(tokenizer, staging, config.tokenizer)
        progress.update(f"trained, vocabulary {tokenizer.get_vocab_size()}", force=True)
        return Produced(
            content_sha256=sha256_json({name: sha256_file(staging / name) for name in TOKENIZER_FILES}),
            metrics={
                "vocab_size": tokenizer.get_vocab_size(),
                "training_chars": train_chars,
                "training_partitions": partitions,
                "seconds": round(progress.elapsed, 3),
            },
        )

    return store.build(spec, produce, run, logger)
