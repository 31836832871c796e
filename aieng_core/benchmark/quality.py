"""Quality figures of a model: validation loss measured again through the stored weights, on
the validation windows training evaluated, against the unigram baseline of the same data."""

from __future__ import annotations

import math
from typing import Any

from aieng_core.config import TrainingConfig
from aieng_core.store import Artifact


def validation_quality(model: Any, dataset: Artifact, training: TrainingConfig, recorded: dict[str, Any]) -> dict:
    """Cross-entropy (nats/token) of `model` on the dataset's validation stream, over the fixed
    windows training evaluates (training.eval_batches x batch_size windows of block_size tokens),
    and of an add-one unigram model fit on the train stream; `recorded` is the model's manifest
    metrics, whose figures are repeated beside the measured ones."""
    import torch

    from aieng_core.training.corpus import open_token_streams, unigram_cross_entropy
    from aieng_core.training.trainer import eval_starts, evaluate

    train, validation = open_token_streams(dataset)
    starts = eval_starts(len(validation), training)
    loss = evaluate(model, validation, starts, training, torch.device("cpu"))
    baseline = unigram_cross_entropy(train, validation, model.config.vocab_size)
    return {
        "validation_loss": loss,
        "validation_perplexity": math.exp(loss),
        "unigram_baseline_loss": baseline,
        "unigram_baseline_perplexity": math.exp(baseline),
        # Below 1: the model predicts the validation text better than token frequencies alone do.
        "perplexity_vs_unigram": math.exp(loss - baseline),
        "beats_unigram": loss < baseline,
        "block_size": training.block_size,
        "windows": len(starts),
        "tokens_scored": len(starts) * training.block_size,
        "recorded_validation_loss": recorded.get("validation_loss"),
        "recorded_unigram_baseline_loss": recorded.get("unigram_baseline_loss"),
    }
