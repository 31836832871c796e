"""dataset_manifest: the data version of everything the model trains on.

It lists every tokenized partition present with its rows, tokens and content hash, the
tokenizer's hash, the split rule and its counts. Its own hash covers only that canonical
content (never paths, times, artifact ids or Parquet bytes), so the same raw inputs give
the same data version on any machine, and one changed byte of raw text changes it.

It also holds the two token streams training reads, written once here so that training can
memory-map them instead of holding the corpus in RAM (as nanoGPT does): train.bin and
validation.bin, every document's token ids end to end, in partition and document order,
each document in the file of its side of the split; little-endian uint16 when the
tokenizer's ids fit, else uint32. They are written batch by batch, never the whole corpus
in memory, and hashed in the manifest like every artifact file.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.data.empty_day import has_no_data
from aieng_core.data.tables import TOKENS_FILE, iter_batches
from aieng_core.dataset.consistency import staleness
from aieng_core.dataset.split import METHOD, TRAIN, VALIDATION, split_of
from aieng_core.faults import crash_point
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.store import Artifact, ArtifactNotFound, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.store.file_lock import exclusive_lock

TOKENIZER_KIND = asset_keys.BPE_TOKENIZER
TOKENIZED_KIND = asset_keys.TOKENIZED_DOCUMENTS

KIND = asset_keys.DATASET_MANIFEST
# v2: writes the train/validation token streams (train.bin, validation.bin) for training to memory-map.
CODE_VERSION = "dataset_manifest-v2"
DATASET_FILE = "dataset.json"
TOKEN_FILES = {TRAIN: "train.bin", VALIDATION: "validation.bin"}
TOKEN_DTYPES: dict[str, np.dtype] = {
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
}  # little-endian on every machine

log = logging.getLogger("aieng.dataset")


class StaleTokenization(RuntimeError):
    """Some partitions were tokenized with a tokenizer, or from clean text, that is no longer current."""


def token_dtype(vocab_size: int) -> str:
    """The narrowest of TOKEN_DTYPES that holds every id of the vocabulary."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def write_split_tokens(
    tokens_path: Path,
    validation_fraction: float,
    seed: str,
    batch_rows: int,
    outputs: Mapping[str, BinaryIO],
    dtype: str,
) -> dict[str, int]:
    """Append each document's token ids to its side's file, in document order, and count rows
    and tokens per side. One Parquet batch is in memory at a time."""
    layout = TOKEN_DTYPES[dtype]
    limit = np.iinfo(layout).max
    counts: Counter[str] = Counter()
    for batch in iter_batches(tokens_path, columns=["id", "input_ids"], batch_rows=batch_rows):
        lists = batch.column(1)
        flat = np.asarray(lists.flatten())
        lengths = np.diff(np.asarray(lists.offsets))
        if flat.size and (flat.min() < 0 or flat.max() > limit):  # never wrap an id around silently
            raise ValueError(f"{tokens_path}: token ids outside 0..{limit}, the range of {dtype}")
        is_train = np.array(
            [split_of(doc_id, validation_fraction, seed) == TRAIN for doc_id in batch.column(0).to_pylist()], dtype=bool
        )
        token_is_train = np.repeat(is_train, lengths)
        for side, rows, tokens in ((TRAIN, is_train, token_is_train), (VALIDATION, ~is_train, ~token_is_train)):
            outputs[side].write(flat[tokens].astype(layout).tobytes())
            counts[f"{side}_rows"] += int(rows.sum())
            counts[f"{side}_tokens"] += int(tokens.sum())
    return {
        key: counts.get(key, 0)
        for key in (f"{TRAIN}_rows", f"{TRAIN}_tokens", f"{VALIDATION}_rows", f"{VALIDATION}_tokens")
    }


def build_dataset_manifest(
    store: ArtifactStore, config: AiengConfig, run: RunInfo = RunInfo(), logger: Any = log
) -> Artifact:
    """The manifest of every tokenized partition current now. Builds run one at a time, each
    reading the refs once it holds the lock: ingest runs of several days finish in any order,
    and the last manifest made (the current one) lists every partition tokenized before it."""
    with exclusive_lock(
        store.home / "work" / "locks" / f"{KIND}.lock",
        on_wait=lambda: logger.info(f"{KIND}: waiting for another build of the dataset manifest to finish"),
    ):
        return _build_dataset_manifest(store, config, run, logger)


def _build_dataset_manifest(store: ArtifactStore, config: AiengConfig, run: RunInfo, logger: Any) -> Artifact:
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
        config_sections=config.section_values("dataset"),
        inputs=((TOKENIZER_KIND, tokenizer.id), *((TOKENIZED_KIND, tokenized[p].id) for p in partitions)),
    )

    def produce(staging: Path) -> Produced:
        store.check_input(tokenizer)
        for artifact in tokenized.values():
            store.check_input(artifact)
        dataset = config.dataset
        dtype = token_dtype(tokenizer.metrics["vocab_size"])
        entries = []
        with ExitStack() as files:
            outputs = {side: files.enter_context(open(staging / name, "wb")) for side, name in TOKEN_FILES.items()}
            for partition in partitions:
                artifact = tokenized[partition]
                counts = write_split_tokens(
                    artifact.file(TOKENS_FILE),
                    dataset.validation_fraction,
                    dataset.split_seed,
                    config.data.batch_rows,
                    outputs,
                    dtype,
                )
                entries.append(
                    {
                        "partition": partition,
                        "rows": artifact.metrics["rows"],
                        "tokens": artifact.metrics["tokens"],
                        "sha256": artifact.content_sha256,
                        **counts,
                        # Recorded only when true: a dataset without empty days keeps its data version.
                        **({"no_data": True} if has_no_data(artifact) else {}),
                    }
                )
                crash_point("dataset_manifest.partition_split")
        totals = {key: sum(entry[key] for entry in entries) for key in ("rows", "tokens", *counts)}
        without_data = [entry["partition"] for entry in entries if entry.get("no_data")]
        content = {
            "partitions": entries,
            "tokenizer_sha256": tokenizer.content_sha256,
            "split": {"method": METHOD, "validation_fraction": dataset.validation_fraction, "seed": dataset.split_seed},
            "totals": totals,
            # What training memory-maps; the files' hashes make the data version cover their bytes too.
            "token_files": {
                side: {
                    "file": name,
                    "dtype": dtype,
                    "byte_order": "little",
                    "tokens": totals[f"{side}_tokens"],
                    "sha256": sha256_file(staging / name),
                }
                for side, name in TOKEN_FILES.items()
            },
        }
        document = {
            **content,
            "tokenizer_id": tokenizer.id,
            "artifacts": {partition: tokenized[partition].id for partition in partitions},
        }
        (staging / DATASET_FILE).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        logger.info(
            f"{KIND}: {len(entries)} partitions ({len(without_data)} without data), {totals['rows']} documents, "
            f"{totals['tokens']} tokens"
        )
        return Produced(
            content_sha256=sha256_json(content),
            metrics={"partitions": len(entries), "partitions_without_data": without_data, **totals},
            extra={"tokenizer_id": tokenizer.id},
        )

    return store.build(spec, produce, run, logger)


def read_dataset(artifact: Artifact) -> dict[str, Any]:
    return json.loads(artifact.file(DATASET_FILE).read_text(encoding="utf-8"))
