"""Gate step 2: the candidate's quality beside the deployed model's, on the same held-out text.

The measure is bits per byte of UTF-8 text: the sum of a model's next-token losses over a
text, in bits, divided by the text's length in bytes. It does not depend on the tokenizer, so
two bundles with different vocabularies are compared on equal terms (a loss per token would
favour the one that cuts text into more, easier tokens).

The exam is both sides' held-out documents: the validation documents of the candidate's
dataset and those of the deployed model's (each decoded from its dataset's validation token
stream by the tokenizer that wrote it), so neither side picks its own exam. Each text is
capped at MAX_TEXT_BYTES, whole documents in stream order. Every model scores every
document the same way: EOS as the first context (as in the packed stream training read),
then windows of at most its max_context tokens; the EOS ending a document is not scored
(no byte of text stands for it).

The candidate is refused when
- its bits per byte on the pooled text is not below the unigram baseline's (token
  frequencies of the candidate's train stream, add-one, scored on the same targets): a model
  that has learned nothing beyond frequencies;
- or it is worse than the deployed model's by more than `gate.max_quality_regression` (a
  fraction: 0.02 lets it be at most 2% above), on the pooled text or on either text alone
  (better on its own new documents does not excuse worse on the ones production serves); a
  text shorter than `gate.quality_min_text_bytes` counts in the pooled text only.
The figures are deterministic (no sampling): the same two models on the same text give the
same decision every run. A first deployment has only the floor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aieng_core.asset_keys import SERVING_BUNDLE
from aieng_core.config import AiengConfig
from aieng_core.gate.report import GateFailed
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactNotFound, ArtifactStore

# The measure itself (and MAX_TEXT_BYTES) lives below both this step and the int8 variant's check.
from aieng_core.training.held_out_text import (
    dataset_of,
    held_out_text,
    model_bits,
    scored_windows,
    verified_dataset,
)

DEVICE = "cpu"


def unigram_table(dataset: Artifact, bundle: Any) -> Any:
    """Bits of each token id under the add-one unigram model of the bundle's train stream (its
    own dataset, verified_dataset): the baseline a language model must beat (it knows
    frequencies, no context)."""
    import numpy as np

    from aieng_core.training.corpus import chunks, open_token_streams

    train, _ = open_token_streams(dataset)
    vocab = int(bundle.model.config.vocab_size)
    counts = np.ones(vocab, dtype=np.float64)
    for chunk in chunks(train, 1 << 18):
        counts += np.bincount(chunk, minlength=vocab)
    return -np.log2(counts / counts.sum())


def unigram_bits(table: Any, bundle: Any, documents: list[str]) -> float:
    """Total bits of the unigram `table` on the targets the bundle's model is scored on."""
    import numpy as np

    return float(
        sum(table[np.asarray(targets, dtype=np.int64)].sum() for _, targets in scored_windows(bundle, documents))
    )


def quality_step(
    candidate_path: Path, store: ArtifactStore, deployed_id: str | None, config: AiengConfig
) -> dict[str, Any]:
    from aieng_core.bundle.verify import load_bundle

    limit = config.gate.max_quality_regression
    figures: dict[str, Any] = {
        "measure": "bits per byte of UTF-8 text (next-token loss in bits / bytes of text); lower is better",
        "max_quality_regression": limit,
        "deployed_bundle_id": deployed_id,
        "texts": [],
    }
    # The verify step re-hashed the candidate and replayed its goldens; the deployed bundle's
    # files are re-hashed as it loads.
    candidate = load_bundle(candidate_path, DEVICE, check_goldens=False)
    refuse_int8_beyond_margin(candidate, store, config, figures)
    candidate_dataset = verified_dataset(store, dataset_of(candidate))  # the text's and the baseline's
    texts = [held_out_text(candidate_dataset, candidate, "candidate_validation")]
    deployed = None
    if deployed_id is None:
        figures["note"] = "first deployment: only the unigram floor applies"
    else:
        try:
            deployed = load_bundle(store.get(SERVING_BUNDLE, deployed_id).path, DEVICE, check_goldens=False)
        except (ArtifactNotFound, ArtifactIntegrityError, OSError, ValueError) as exc:
            # Production's problem (`aieng store verify` names it): it does not stop this candidate.
            figures["note"] = f"not compared: the deployed bundle {deployed_id} cannot be loaded ({exc}); floor only"
    if deployed is not None:
        try:
            deployed_dataset = dataset_of(deployed)
            if deployed_dataset == texts[0].dataset_manifest:
                figures["note"] = "both models were trained on the same dataset: one held-out text"
            else:
                deployed_text = held_out_text(
                    verified_dataset(store, deployed_dataset), deployed, "deployed_validation"
                )
                texts.append(deployed_text)
        except (ArtifactNotFound, ArtifactIntegrityError, OSError, ValueError) as exc:
            # Both models are still scored on the candidate's text: the comparison stands.
            figures["note"] = f"the deployed model's held-out text is not available ({exc}): the candidate's only"
    figures["texts"] = [text.summary() for text in texts]
    total_bytes = sum(text.bytes for text in texts)
    sides: dict[str, Any] = {"candidate": candidate, "unigram": None}
    if deployed is not None:
        sides["deployed"] = deployed
    per_text: dict[str, dict[str, float]] = {name: {} for name in sides}
    pooled: dict[str, float] = {}
    table = unigram_table(candidate_dataset, candidate)
    for name, bundle in sides.items():
        bits_total = 0.0
        for text in texts:
            if bundle is None:
                bits = unigram_bits(table, candidate, text.documents)
            else:
                bits = model_bits(bundle, text.documents)[0]
            per_text[name][text.name] = bits / text.bytes
            bits_total += bits
        pooled[name] = bits_total / total_bytes
    for name in sides:
        figures[name] = {"bits_per_byte": pooled[name], "per_text": per_text[name]}
    figures["candidate"]["bundle_id"] = candidate.bundle_id
    if deployed is not None:
        figures["deployed"]["bundle_id"] = deployed.bundle_id
        figures["worse_by"] = pooled["candidate"] / pooled["deployed"] - 1.0
    figures["vs_unigram"] = pooled["candidate"] / pooled["unigram"]
    if pooled["candidate"] >= pooled["unigram"]:
        raise GateFailed(
            "quality",
            "bits_per_byte",
            f"the candidate's {pooled['candidate']:.4f} bits per byte on the held-out text is not below the unigram "
            f"baseline's {pooled['unigram']:.4f}: it predicts no better than token frequencies",
            value=pooled["candidate"],
            limit=pooled["unigram"],
            figures=figures,
        )
    if deployed is None:
        return figures
    figures["worse_by_text"] = {
        name: per_text["candidate"][name] / per_text["deployed"][name] - 1.0 for name in per_text["candidate"]
    }
    minimum = config.gate.quality_min_text_bytes
    judged = [text.name for text in texts if text.bytes >= minimum]
    figures["quality_min_text_bytes"] = minimum
    figures["judged_alone"] = judged
    if len(judged) < len(texts):
        figures["not_judged_alone"] = {
            text.name: f"{text.bytes} bytes, under gate.quality_min_text_bytes {minimum}: in the pooled figure only"
            for text in texts
            if text.name not in judged
        }
    found = regression(pooled, per_text, limit, judged)
    if found is not None:
        where, worse = found
        value = pooled["candidate"] if where == POOLED else per_text["candidate"][where]
        reference = pooled["deployed"] if where == POOLED else per_text["deployed"][where]
        named = [t for t in texts if t.name == where]
        on = (
            f"{where} ({len(named[0].documents)} documents of dataset manifest {named[0].dataset_manifest})"
            if named
            else "the held-out text"
        )
        raise GateFailed(
            "quality",
            "bits_per_byte" if where == POOLED else f"bits_per_byte.{where}",
            f"the candidate's {value:.4f} bits per byte on {on} is {worse:.1%} above the deployed model's "
            f"{reference:.4f} ({deployed.bundle_id}); gate.max_quality_regression allows {limit:.1%}"
            + ("" if where == POOLED else " on each held-out text as on the pooled one"),
            value=value,
            limit=reference * (1.0 + limit),
            figures=figures,
        )
    return figures


POOLED = "pooled"


def refuse_int8_beyond_margin(
    candidate: Any, store: ArtifactStore, config: AiengConfig, figures: dict[str, Any]
) -> None:
    """An int8 variant (its verified serving.json says so) is judged against its float32 source
    first, both measured again here on the same held-out text, by the rule its bundle check
    applies (bundle/int8_variant.py)."""
    from aieng_core.bundle.int8_variant import int8_refusal, measured_int8_quality, serves_int8

    if not serves_int8(candidate):
        return
    margin = config.gate.int8_max_quality_regression
    quality = measured_int8_quality(store, candidate)
    figures["int8"] = {"margin": margin, **quality}
    refusal = int8_refusal(quality, margin)
    if refusal is not None:
        raise GateFailed(
            "quality",
            "int8_bits_per_byte",
            refusal,
            value=quality["int8_bits_per_byte"],
            limit=quality["fp32_bits_per_byte"] * (1.0 + margin),
            figures=figures,
        )


def regression(
    pooled: dict[str, float], per_text: dict[str, dict[str, float]], limit: float, judged: list[str]
) -> tuple[str, float] | None:
    """(where, worse by) of the candidate's first regression beyond `limit`: on the pooled text,
    else on one of the `judged` texts alone; None when there is none. Each text counts on its
    own so that a candidate far better on its own new documents cannot buy a regression on the
    documents production already serves well (landed noise does exactly that); one too short to
    measure on its own (gate.quality_min_text_bytes) counts in the pooled text only."""
    worse = pooled["candidate"] / pooled["deployed"] - 1.0
    if worse > limit:
        return POOLED, worse
    for name in judged:
        worse = per_text["candidate"][name] / per_text["deployed"][name] - 1.0
        if worse > limit:
            return name, worse
    return None
