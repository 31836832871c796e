"""A model's validation loss as bits per byte of the validation text.

Training and the benchmark measure cross-entropy per token (nats), which depends on the
tokenizer: a vocabulary that cuts text into more, easier tokens scores lower. Bits per byte
does not, and it is the unit the promotion gate decides in. Here the loss per token is
converted with the validation stream's own ratio of tokens to UTF-8 bytes of text:

    bits per byte = loss / ln 2 * tokens / bytes

The tokens are those of the packed validation stream (documents and the EOS after each, as
the validation windows score them); the bytes are the text those documents decode to. The
ratio is taken over whole documents of the stream's first SAMPLE_TOKENS tokens, so it costs
one decode of at most that many tokens, whatever the corpus size.

This is a conversion of the training figure, not the gate's measurement: the gate
(gate/quality.py) scores whole held-out documents of both datasets and leaves the EOS out,
so its figure for the same model differs slightly. Nothing a stage writes depends on this
module (no stage imports it): it makes metadata only.
"""

from __future__ import annotations

import math

import numpy as np

from aieng_core.asset_keys import DATASET_MANIFEST
from aieng_core.store import Artifact, ArtifactStore
from aieng_core.tokenizer.bpe import load_tokenizer, special_ids
from aieng_core.training.corpus import open_token_streams

SAMPLE_TOKENS = 1 << 20  # a few MiB of text: enough for a stable ratio, cheap to decode
LN2 = math.log(2.0)


def tokens_per_byte(model: Artifact, store: ArtifactStore) -> float | None:
    """Tokens of the validation stream per byte of its text, for a model_checkpoint (its
    tokenizer files and its dataset_manifest input); None when it names no dataset or the stream
    holds no text.

    The dataset is read without re-hashing it: the model's build verified it, and a figure
    shown beside the model is not worth hashing every token file again on each materialization."""
    dataset_id = next((i["id"] for i in model.manifest.get("inputs", []) if i["kind"] == DATASET_MANIFEST), None)
    if dataset_id is None:
        return None
    _, validation = open_token_streams(store.get(DATASET_MANIFEST, dataset_id))
    tokens = validation[0 : min(len(validation), SAMPLE_TOKENS)]
    tokenizer = load_tokenizer(model.path)
    special = np.isin(tokens, sorted(special_ids(tokenizer)))
    if len(tokens) < len(validation) and special.any():
        cut = int(np.flatnonzero(special)[-1]) + 1  # whole documents: through the last EOS of the sample
        tokens, special = tokens[:cut], special[:cut]
    text_bytes = len(tokenizer.decode(tokens[~special].tolist(), skip_special_tokens=True).encode("utf-8"))
    return len(tokens) / text_bytes if text_bytes else None


def bits_per_byte(loss_nats_per_token: float, ratio: float) -> float:
    """A cross-entropy in nats per token as bits per byte, given tokens per byte."""
    return loss_nats_per_token / LN2 * ratio
