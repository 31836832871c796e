"""Token streams for training: the dataset manifest's train.bin and validation.bin, read from disk.

dataset_manifest writes every document's tokens end to end (each ends with EOS, so the
concatenation is the packed stream a causal LM trains on), one file per side of the split.
Training never loads a stream whole: it reads the windows of each batch, and the unigram
baseline counts the stream chunk by chunk, so memory does not grow with the corpus.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aieng_core.dataset.dataset_manifest import KIND as DATASET_KIND
from aieng_core.dataset.dataset_manifest import TOKEN_DTYPES, TOKEN_FILES, read_dataset
from aieng_core.dataset.split import TRAIN, VALIDATION
from aieng_core.store import Artifact
from aieng_core.store.artifacts import rebuild_command

CHUNK_TOKENS = 1 << 18  # tokens per read when a whole stream is scanned: a few MiB with temporaries


class OutdatedDataset(RuntimeError):
    """A dataset_manifest artifact made before the token files existed: it must be rebuilt."""


@dataclass(frozen=True)
class TokenFile:
    """A token stream on disk that reads like a read-only 1-D array: `len(stream)`,
    `stream[index_array]`, `stream[a:b]`, each read returning a new in-memory array.

    The file is memory-mapped afresh for every read and unmapped after it, as nanoGPT does:
    a long-lived map would keep every page it ever touched resident in this process, so a
    long run would end up holding the whole file.
    """

    path: Path
    dtype: np.dtype
    length: int

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: Any) -> np.ndarray:
        if self.length == 0:  # an empty file cannot be mapped
            return np.empty(0, dtype=self.dtype)[index]
        mapped = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.length,))
        return np.array(mapped[index])  # a copy: nothing keeps the map alive after this read


# What training reads: a token file, or an array already in memory (small streams in tests).
TokenStream = TokenFile | np.ndarray


def open_token_streams(dataset_artifact: Artifact) -> tuple[TokenFile, TokenFile]:
    """(train, validation) token files of a dataset_manifest artifact, in partition and
    document order. Verify the artifact (store.check_input) before reading them."""
    dataset = read_dataset(dataset_artifact)
    if "token_files" not in dataset:
        raise OutdatedDataset(
            f"{DATASET_KIND} artifact {dataset_artifact.id} has no token files (train.bin, validation.bin): it was "
            f"made by {dataset_artifact.manifest.get('code_version')}, an older dataset_manifest; re-materialize "
            f"it with `{rebuild_command(DATASET_KIND, None)}`, then retry"
        )
    streams = []
    for side in (TRAIN, VALIDATION):
        entry = dataset["token_files"][side]
        if entry["file"] != TOKEN_FILES[side] or entry["dtype"] not in TOKEN_DTYPES or entry["byte_order"] != "little":
            raise ValueError(f"{dataset_artifact.path}: unsupported {side} token file {entry}")
        stream = TokenFile(dataset_artifact.file(entry["file"]), TOKEN_DTYPES[entry["dtype"]], entry["tokens"])
        size = stream.path.stat().st_size
        if size != stream.length * stream.dtype.itemsize:
            raise ValueError(
                f"{stream.path}: {size} bytes, but dataset.json says {stream.length} {entry['dtype']} tokens"
            )
        streams.append(stream)
    return streams[0], streams[1]


def chunks(stream: TokenStream, size: int) -> Iterator[np.ndarray]:
    for begin in range(0, len(stream), size):
        yield stream[begin : begin + size]


def unigram_cross_entropy(
    train: TokenStream, validation: TokenStream, vocab_size: int, chunk_tokens: int = CHUNK_TOKENS
) -> float:
    """Cross-entropy (nats/token) on validation of a unigram model fit on train (add-one).

    The baseline a language model must beat: it knows token frequencies, not context.
    Both streams are scanned `chunk_tokens` at a time, never held whole.
    """
    counts = np.ones(vocab_size, dtype=np.float64)  # add-one smoothing
    for chunk in chunks(train, chunk_tokens):
        counts += np.bincount(chunk, minlength=vocab_size)
    log_probs = np.log(counts / counts.sum())
    if len(validation) == 0:
        return float("nan")  # no mean over no tokens; training refuses an empty validation stream itself
    total = sum(float(log_probs[chunk].sum()) for chunk in chunks(validation, chunk_tokens))
    return -total / len(validation)
