"""Bits per byte of UTF-8 text: a model's next-token loss over a held-out text, in bits,
divided by the text's length in bytes. The measure the promotion gate compares candidates by
(gate/quality.py) and an int8 variant is judged by against its float32 source
(bundle/int8_variant.py): both score the same documents the same way, from here.

The text is a dataset's validation documents, decoded from its validation token stream by the
tokenizer that wrote it, whole documents in stream order up to MAX_TEXT_BYTES. Each document
is scored EOS first (as in the packed stream training read), in windows of at most the
bundle's max_context tokens; the EOS ending a document is not scored (no byte of text stands
for it). Deterministic: no sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from aieng_core.asset_keys import DATASET_MANIFEST
from aieng_core.store import Artifact, ArtifactStore

MAX_TEXT_BYTES = 1 << 20  # per held-out text: bounds the step's time on a large dataset
BATCH_WINDOWS = 16
IGNORED = -100  # the target of a padding position
LN2 = math.log(2.0)


@dataclass(frozen=True)
class HeldOutText:
    name: str  # "candidate_validation" | "deployed_validation"
    dataset_manifest: str
    documents: list[str]
    bytes: int
    truncated: bool  # documents were left out to stay within MAX_TEXT_BYTES

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dataset_manifest": self.dataset_manifest,
            "documents": len(self.documents),
            "bytes": self.bytes,
            "truncated": self.truncated,
        }


def dataset_of(bundle: Any) -> str:
    """The dataset_manifest id a loaded bundle's model was trained on (its lineage summary)."""
    lineage = bundle.manifest.get("lineage") or {}
    dataset_id = lineage.get(DATASET_MANIFEST)
    if not isinstance(dataset_id, str):
        raise ValueError(f"{bundle.path / 'manifest.json'}: its lineage names no {DATASET_MANIFEST}")
    return dataset_id


def verified_dataset(store: ArtifactStore, dataset_id: str) -> Artifact:
    """The dataset_manifest `dataset_id`, re-hashed once before anything reads it (a damaged
    one raises, naming the file)."""
    return store.check_input(store.get(DATASET_MANIFEST, dataset_id))


def held_out_text(dataset: Artifact, bundle: Any, name: str) -> HeldOutText:
    """The validation documents of `dataset` (verified_dataset), decoded by `bundle`'s tokenizer
    (the one the dataset was tokenized with)."""
    import numpy as np

    from aieng_core.training.corpus import open_token_streams

    dataset_id = dataset.id
    _, validation = open_token_streams(dataset)
    tokens = validation[0 : len(validation)]
    ends = np.flatnonzero(tokens == bundle.eos_token_id)
    documents: list[str] = []
    size, begin, truncated = 0, 0, False
    for end in [*ends.tolist(), len(tokens)]:
        ids = tokens[begin:end].tolist()
        begin = end + 1
        if not ids:
            continue
        text = bundle.tokenizer.decode(ids, skip_special_tokens=False)
        length = len(text.encode("utf-8"))
        if size + length > MAX_TEXT_BYTES and documents:
            truncated = True
            break
        documents.append(text)
        size += length
    if not documents:
        raise ValueError(f"{DATASET_MANIFEST} {dataset_id} has no validation documents: there is no held-out text")
    return HeldOutText(name, dataset_id, documents, size, truncated)


def scored_windows(bundle: Any, documents: list[str]) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) windows of at most the bundle's max_context tokens, EOS first."""
    context = int(bundle.serving["max_context"])
    windows = []
    for text in documents:
        ids = [bundle.eos_token_id, *bundle.tokenizer.encode(text, add_special_tokens=False).ids]
        for start in range(0, len(ids) - 1, context):
            chunk = ids[start : start + context + 1]
            windows.append((chunk[:-1], chunk[1:]))
    return windows


def model_bits(bundle: Any, documents: list[str]) -> tuple[float, int]:
    """(total next-token loss in bits, tokens scored) of the bundle's model on `documents`."""
    import torch
    import torch.nn.functional as F

    windows = sorted(scored_windows(bundle, documents), key=lambda w: len(w[0]))
    total, scored = 0.0, 0
    model = bundle.model
    model.eval()
    with torch.no_grad():
        for begin in range(0, len(windows), BATCH_WINDOWS):
            batch = windows[begin : begin + BATCH_WINDOWS]
            width = max(len(inputs) for inputs, _ in batch)
            # Padding goes after each window: a causal model's earlier positions never see it,
            # and its targets are ignored.
            x = torch.tensor([inputs + [0] * (width - len(inputs)) for inputs, _ in batch], dtype=torch.long)
            y = torch.tensor([targets + [IGNORED] * (width - len(targets)) for _, targets in batch], dtype=torch.long)
            logits, _ = model(x)
            loss = F.cross_entropy(
                logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORED, reduction="sum"
            )
            total += float(loss) / LN2
            scored += int((y != IGNORED).sum())
    return total, scored
