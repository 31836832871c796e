"""Token streams for training: every document of the dataset, packed end to end.

Each tokenized document already ends with EOS, so concatenating them gives the packed
stream a causal LM trains on; the manifest's split rule puts each document, by id, in the
train or the validation stream.
"""

from __future__ import annotations

import numpy as np

from aieng_core.data.tables import TOKENS_FILE, iter_batches
from aieng_core.dataset.dataset_manifest import read_dataset
from aieng_core.dataset.split import TRAIN, split_of
from aieng_core.store import Artifact, ArtifactStore
from aieng_core.tokenizer.tokenized_documents import KIND as TOKENIZED_KIND


def split_token_streams(store: ArtifactStore, dataset_artifact: Artifact) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) token ids as int64 arrays, in partition and document order."""
    dataset = read_dataset(dataset_artifact)
    fraction, seed = dataset["split"]["validation_fraction"], dataset["split"]["seed"]
    streams: dict[bool, list[np.ndarray]] = {True: [], False: []}
    for partition in sorted(dataset["artifacts"]):
        tokenized = store.check_input(store.get(TOKENIZED_KIND, dataset["artifacts"][partition]))
        for batch in iter_batches(tokenized.file(TOKENS_FILE), columns=["id", "input_ids"]):
            lists = batch.column(1)
            flat = np.asarray(lists.flatten())
            offsets = np.asarray(lists.offsets) - lists.offsets[0].as_py()
            for index, doc_id in enumerate(batch.column(0).to_pylist()):
                streams[split_of(doc_id, fraction, seed) == TRAIN].append(flat[offsets[index] : offsets[index + 1]])
    as_array = lambda parts: np.concatenate(parts).astype(np.int64) if parts else np.empty(0, dtype=np.int64)  # noqa: E731
    return as_array(streams[True]), as_array(streams[False])


def unigram_cross_entropy(train: np.ndarray, validation: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) on validation of a unigram model fit on train (add-one).

    The baseline a language model must beat: it knows token frequencies, not context.
    """
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    log_probs = np.log(counts / counts.sum())
    return float(-log_probs[validation].mean())
