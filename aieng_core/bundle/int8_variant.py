"""The int8 variant of a serving bundle (bundle.weights: int8): the same bundle with its linear
weights in int8 (model/int8_weights.py names the method), built from the float32 bundle it
names as its only input, so its manifest and lineage say exactly which float32 bytes it was
quantized from.

What it holds beside the float32 bundle's files (config, tokenizer, benchmark.json copied
byte for byte and checked against the source's manifest): model.safetensors in int8,
serving.json with `weights: int8` and the method, and goldens recorded again through the int8
engine (replayed by `aieng bundle verify` like any bundle's). Its manifest's metrics add:
- golden_agreement: the int8 greedy continuations of the golden prompts against the float32
  bundle's, prompt by prompt (identical, tokens agreeing before the first divergence);
- int8_quality: bits per byte of both models on the held-out text of the model's dataset
  (the gate's measure, training/held_out_text.py), and how much worse the int8 one is.
Whether that is acceptable is decided where the margin lives (gate.int8_max_quality_regression):
`int8_refusal`, which the bundle's blocking check and the gate both call.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.hashing import sha256_file
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.store.artifacts import MANIFEST

BUNDLE = asset_keys.SERVING_BUNDLE  # the kind it builds (serving_bundle.py is the kind's builder)
# This builder's own version, locked to its source (and model/int8_weights.py's) by
# code_versions.py like every stage's, and recorded in the variant's recipe; the spec's
# code_version is the kind's (serving_bundle.CODE_VERSION, which `aieng store rebuild` checks).
# v2: golden conversations recorded again through the int8 weights; the lineage names the chat template.
CODE_VERSION = "serving_bundle_int8-v2"
WEIGHTS = "int8"
# Copied from the float32 bundle as they are; model.safetensors, serving.json and golden.json are made here.
COPIED_FILES = ("config.json", "generation_config.json", "benchmark.json")


def is_variant(bundle: Artifact) -> bool:
    """What its manifest says (for display); decisions read the verified serving.json (`serves_int8`)."""
    return bundle.metrics.get("weights") == WEIGHTS


def serves_int8(loaded: Any) -> bool:
    """A loaded (verified) bundle is an int8 variant: its serving.json, a hashed file, says so."""
    return loaded.serving.get("weights") == WEIGHTS


def variant_spec(config: AiengConfig, source: Artifact, threads: int) -> ArtifactSpec:
    from aieng_core.bundle import serving_bundle
    from aieng_core.bundle.golden import GOLDEN_DEVICE
    from aieng_core.model.int8_weights import METHOD

    return ArtifactSpec(
        kind=BUNDLE,
        code_version=serving_bundle.CODE_VERSION,
        config_sha256=serving_bundle.bundle_config_sha256(config),
        config_sections=serving_bundle.bundle_sections(config),
        inputs=((BUNDLE, source.id),),
        recipe={
            "weights": WEIGHTS,
            "variant_code_version": CODE_VERSION,
            "method": METHOD,
            "device": GOLDEN_DEVICE,
            "threads": threads,
        },
    )


def build_int8_variant(
    store: ArtifactStore, config: AiengConfig, source: Artifact, threads: int, run: RunInfo, logger: Any
) -> Artifact:
    """Build (or reuse) the int8 variant of the float32 bundle `source`."""
    from aieng_core.store.lineage import lineage_summary

    store.check_input(source)
    spec = variant_spec(config, source, threads)
    lineage = lineage_summary(store, source)

    def produce(staging: Path) -> Produced:
        produced = produce_variant_files(staging, store, source, threads)
        agreement = produced.metrics["golden_agreement"]
        quality = produced.metrics["int8_quality"]
        logger.info(
            f"{BUNDLE}: int8 variant of {source.id}: {agreement['identical']}/{agreement['prompts']} goldens identical "
            f"to float32, {quality['int8_bits_per_byte']:.4f} vs {quality['fp32_bits_per_byte']:.4f} bits per byte "
            f"({quality['worse_by']:+.2%})"
        )
        chat = {"chat_template_sha256": produced.metrics["chat_template_sha256"]}
        return Produced(
            produced.content_sha256, produced.metrics, extra={**produced.extra, "lineage": {**lineage, **chat}}
        )

    return store.build(spec, produce, run, logger)


def produce_variant_files(staging: Path, store: ArtifactStore, source: Artifact, threads: int) -> Produced:
    from aieng_core.bundle.golden import GOLDEN_DEVICE, record_goldens
    from aieng_core.bundle.serving_bundle import (
        BUNDLE_FILES,
        GOLDEN_FILE,
        SERVING_FILE,
        bundle_content_sha256,
        copy_verified,
        engine_for,
        write_json,
    )
    from aieng_core.bundle.verify import LoadedBundle, load_bundle
    from aieng_core.model.hf_files import MODEL_FILE, load_model, save_int8_weights
    from aieng_core.model.int8_weights import METHOD
    from aieng_core.serving.device import torch_threads
    from aieng_core.serving.greedy import golden_agreement
    from aieng_core.tokenizer.bpe import TOKENIZER_FILES

    with torch_threads(threads):
        # The float32 bundle, re-hashed and its goldens replayed: what is quantized is what it names.
        fp32 = load_bundle(source.path, GOLDEN_DEVICE)
        if serves_int8(fp32):
            raise ValueError(f"{BUNDLE} {source.id} is an int8 variant itself: a variant is made from a float32 bundle")
        copy_verified(source, (*COPIED_FILES, *TOKENIZER_FILES), staging, "the source bundle's")
        save_int8_weights(fp32.model, staging)
        settings = {**fp32.serving, "weights": WEIGHTS, "weights_method": METHOD}
        write_json(staging / SERVING_FILE, settings)
        # Goldens and figures come from the int8 bytes just written, loaded as a server loads them.
        staged = Artifact(
            kind=BUNDLE,
            id="staging",
            path=staging,
            manifest={"files": {name: sha256_file(staging / name) for name in (MODEL_FILE, "config.json")}},
        )
        model = load_model(staged, GOLDEN_DEVICE)
        # The goldens as load_bundle replayed them; the document around them is re-read for its
        # other fields, and must still hold the same outputs.
        golden_doc = json.loads((source.path / GOLDEN_FILE).read_text(encoding="utf-8"))
        if golden_doc.get("outputs") != fp32.golden:
            raise ArtifactIntegrityError(f"{source.path / GOLDEN_FILE}: changed after it was verified")
        # In the order record_goldens wrote them: the prompts, then the conversations.
        prompts = [entry["prompt"] for entry in fp32.golden if "messages" not in entry]
        conversations = [entry["messages"] for entry in fp32.golden if "messages" in entry]
        max_new = int(fp32.golden[0]["max_new_tokens"])
        engine = engine_for(model, fp32.tokenizer, settings, max_waiting=len(fp32.golden))
        outputs = record_goldens(engine, prompts, conversations, fp32.chat_template, max_new)
        write_json(staging / GOLDEN_FILE, {**golden_doc, "threads": threads, "outputs": outputs})
        int8 = LoadedBundle(
            "staging", staging, {}, settings, outputs, model, fp32.tokenizer, fp32.eos_token_id, fp32.chat_template
        )
        quality = int8_quality(store, fp32, int8)

    content = {name: sha256_file(staging / name) for name in BUNDLE_FILES}
    written = [*BUNDLE_FILES, "benchmark.json"]
    source_metrics = source.metrics
    metrics = {
        **{name: source_metrics[name] for name in ("model_checkpoint_id", "benchmark_report_id", "benchmark")},
        **{name: source_metrics[name] for name in ("parameters", "eos_token_id", "kv_cache_bytes")},
        **{name: source_metrics[name] for name in ("max_batch", "max_context", "max_prefill_tokens")},
        "weights": WEIGHTS,
        "weights_method": METHOD,
        "source_bundle_id": source.id,
        "golden_prompts": len(prompts),
        "golden_conversations": len(conversations),
        "chat_template_sha256": fp32.chat_template.sha256,
        "golden_max_new_tokens": max_new,
        "golden_threads": threads,
        "golden_agreement": golden_agreement(fp32.golden, outputs),
        "int8_quality": quality,
        "files": len(written),
        "bytes": sum((staging / name).stat().st_size for name in written),
        "model_bytes": (staging / MODEL_FILE).stat().st_size,
        "source_model_bytes": (source.path / MODEL_FILE).stat().st_size,
    }
    return Produced(content_sha256=bundle_content_sha256(content), metrics=metrics)


def int8_quality(store: ArtifactStore, fp32: Any, int8: Any) -> dict[str, Any]:
    """Bits per byte of both loaded bundles on the held-out text of their model's dataset."""
    from aieng_core.training.held_out_text import dataset_of, held_out_text, model_bits, verified_dataset

    text = held_out_text(verified_dataset(store, dataset_of(fp32)), fp32, "held_out_validation")
    fp32_bpb = model_bits(fp32, text.documents)[0] / text.bytes
    int8_bpb = model_bits(int8, text.documents)[0] / text.bytes
    return {
        "measure": "bits per byte of UTF-8 text (next-token loss in bits / bytes of text); lower is better",
        "text": text.summary(),
        "fp32_bits_per_byte": fp32_bpb,
        "int8_bits_per_byte": int8_bpb,
        "worse_by": int8_bpb / fp32_bpb - 1.0,
    }


def measured_int8_quality(store: ArtifactStore, variant: Any) -> dict[str, Any]:
    """int8_quality measured again on verified bytes: `variant` (a loaded bundle) and its float32
    source (its manifest's only input, re-hashed as it loads), on the same held-out text. What
    the check and the gate decide on: the figures recorded at build time are a record, not trusted."""
    from aieng_core.bundle.golden import GOLDEN_DEVICE
    from aieng_core.bundle.verify import load_bundle

    sources = [item.get("id") for item in variant.manifest.get("inputs", []) if item.get("kind") == BUNDLE]
    named = variant.manifest.get("metrics", {}).get("source_bundle_id")
    if len(sources) != 1 or sources[0] != named:
        raise ArtifactIntegrityError(
            f"{variant.path / MANIFEST}: an int8 variant names one float32 {BUNDLE} as its input and as "
            f"source_bundle_id; this one names {sources} and {named}"
        )
    fp32 = load_bundle(store.get(BUNDLE, str(sources[0])).path, GOLDEN_DEVICE, check_goldens=False)
    if serves_int8(fp32):
        raise ArtifactIntegrityError(f"{fp32.path}: the source of int8 variant {variant.bundle_id} is not float32")
    return {"source_bundle_id": fp32.bundle_id, **int8_quality(store, fp32, variant)}


def int8_refusal(quality: dict[str, Any], margin: float) -> str | None:
    """Why an int8 variant with these figures (int8_quality's, with source_bundle_id) is refused
    under `margin` (gate.int8_max_quality_regression), or None when it is within it."""
    worse = quality.get("worse_by")
    if not isinstance(worse, (int, float)) or not math.isfinite(worse):
        return f"the int8 variant's bits per byte cannot be judged: worse_by is {worse!r}, not a finite number"
    if worse > margin:
        return (
            f"the int8 variant's {quality['int8_bits_per_byte']:.4f} bits per byte on the held-out text is "
            f"{worse:.2%} above its float32 source's {quality['fp32_bits_per_byte']:.4f} "
            f"({quality.get('source_bundle_id')}); gate.int8_max_quality_regression allows {margin:.2%}"
        )
    return None
