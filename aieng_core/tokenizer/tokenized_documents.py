"""tokenized_documents: token ids of one day's clean documents, EOS appended to each.

Reads clean text in record batches and encodes each batch with the Rust tokenizer across
all cores; memory stays bounded by the batch size.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.data.empty_day import has_no_data
from aieng_core.data.tables import CLEAN_FILE, TOKENS_FILE, TOKENS_SCHEMA, iter_batches, parquet_writer
from aieng_core.faults import crash_point
from aieng_core.hashing import ColumnHasher
from aieng_core.progress import Progress
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.tokenizer.bpe import load_tokenizer, special_ids, special_token_id

CLEAN_KIND = asset_keys.CLEAN_DOCUMENTS
TOKENIZER_KIND = asset_keys.BPE_TOKENIZER

KIND = asset_keys.TOKENIZED_DOCUMENTS
# v2: special-token text inside a document is encoded as text, never as the EOS or pad id.
CODE_VERSION = "tokenized_documents-v2"

log = logging.getLogger("aieng.tokenizer")


def refuse_stray_specials(flat: np.ndarray, offsets: np.ndarray, specials: np.ndarray, ids: list[str]) -> None:
    """The only special id in a row may be the EOS we append at its end: one found anywhere
    else would silently split or pad a document in training, so stop instead."""
    stray = np.isin(flat, specials)
    stray[offsets[1:] - 1] = False  # each row's last token, the appended EOS
    if stray.any():
        rows = np.unique(np.searchsorted(offsets, np.flatnonzero(stray), side="right") - 1)
        named = ", ".join(repr(ids[row]) for row in rows[:5])
        raise RuntimeError(
            f"special token ids inside the text of {len(rows)} documents ({named}); the tokenizer must encode "
            "document text as text"
        )


def tokenize_file(
    clean_path: Path, tokenizer_dir: Path, eos_token: str, out_path: Path, batch_rows: int, progress: Progress
) -> Produced:
    tokenizer = load_tokenizer(tokenizer_dir)
    eos = np.array([special_token_id(tokenizer, eos_token)], dtype=np.int32)
    specials = np.array(sorted(special_ids(tokenizer)), dtype=np.int32)
    hasher = ColumnHasher(["id", "input_ids"])
    rows = tokens = 0
    with parquet_writer(out_path, TOKENS_SCHEMA) as writer:
        for batch in iter_batches(clean_path, columns=["id", "text"], batch_rows=batch_rows):
            ids = batch.column(0).to_pylist()
            encodings = tokenizer.encode_batch_fast(batch.column(1).to_pylist(), add_special_tokens=False)
            arrays = [np.concatenate([np.asarray(encoding.ids, dtype=np.int32), eos]) for encoding in encodings]
            lengths = np.array([len(a) for a in arrays], dtype=np.int64)
            flat = np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int32)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            refuse_stray_specials(flat, offsets, specials, ids)
            tokens_batch = pa.RecordBatch.from_arrays(
                [
                    pa.array(ids, type=pa.string()),
                    pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat)),
                    pa.array(lengths.astype(np.int32)),
                ],
                schema=TOKENS_SCHEMA,
            )
            hasher.update(tokens_batch)
            writer.write_batch(tokens_batch)
            crash_point("tokenized_documents.batch_written")
            rows += len(ids)
            tokens += int(lengths.sum())
            progress.update(f"{rows} documents, {tokens} tokens")
    progress.update(f"{rows} documents, {tokens} tokens", force=True)
    return Produced(content_sha256=hasher.hexdigest(), metrics={"rows": rows, "tokens": tokens})


def build_tokenized_documents(
    store: ArtifactStore, config: AiengConfig, partition: str, run: RunInfo = RunInfo(), logger: Any = log
) -> Artifact:
    clean = store.require_current(CLEAN_KIND, partition)
    tokenizer = store.require_current(TOKENIZER_KIND)
    spec = ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=config.section_sha256("tokenizer"),
        config_sections=config.section_values("tokenizer"),
        partition=partition,
        inputs=((CLEAN_KIND, clean.id), (TOKENIZER_KIND, tokenizer.id)),
    )

    def produce(staging: Path) -> Produced:
        store.check_input(clean)
        store.check_input(tokenizer)
        progress = Progress(logger, f"{KIND} {partition}")
        produced = tokenize_file(
            clean.file(CLEAN_FILE),
            tokenizer.path,
            config.tokenizer.eos_token,
            staging / TOKENS_FILE,
            config.data.batch_rows,
            progress,
        )
        metrics = {
            **produced.metrics,
            "tokenizer_id": tokenizer.id,
            "seconds": round(progress.elapsed, 3),
            "no_data": has_no_data(clean),
        }
        return Produced(produced.content_sha256, metrics, extra={"tokenizer_id": tokenizer.id})

    return store.build(spec, produce, run, logger)
