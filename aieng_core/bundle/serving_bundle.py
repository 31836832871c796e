"""serving_bundle: everything `aieng serve` needs, in one immutable, verifiable artifact.

The bundle holds the model (model.safetensors, config.json, generation_config.json), its
tokenizer files, serving.json (engine limits and request defaults from the `serving:` config
section, plus the model's EOS id) and golden.json (greedy continuations of the configured
prompts, recorded by the serving engine itself). Its manifest lists every file's SHA-256,
names the model checkpoint as its input, and carries a lineage summary found by walking the
inputs chain down to the raw snapshots. Same model + serving config + code -> same id, reused.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.bundle.golden import GOLDEN_DEVICE, record_goldens, torch_threads
from aieng_core.config import AiengConfig, ServingConfig
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.store.artifacts import MANIFEST
from aieng_core.store.lineage import lineage_summary
from aieng_core.tokenizer.bpe import TOKENIZER_FILES

# torch is imported inside the functions: the Dagster code location imports this module to
# define the asset, and loading the location must stay light.

KIND = asset_keys.SERVING_BUNDLE
CODE_VERSION = "serving_bundle-v2"
MODEL_KIND = asset_keys.MODEL_CHECKPOINT

# Spelled out (not imported from model/hf_files.py) to keep torch out of this module's imports.
MODEL_FILES = ("model.safetensors", "config.json", "generation_config.json", *TOKENIZER_FILES)
SERVING_FILE = "serving.json"
GOLDEN_FILE = "golden.json"
BUNDLE_FILES = (*MODEL_FILES, SERVING_FILE, GOLDEN_FILE)

# The ServingConfig fields copied into serving.json: what the engine and the server need at run time.
SERVING_FIELDS = (
    "max_batch",
    "max_context",
    "max_waiting",
    "max_prefill_tokens",
    "default_max_new_tokens",
    "default_temperature",
    "default_top_k",
    "default_top_p",
    "request_timeout_s",
    "drain_timeout_s",
    "warmup_prompt_lengths",
    "threads",
    "device",
)
ENGINE_LIMIT_FIELDS = ("max_batch", "max_context", "max_waiting", "max_prefill_tokens")

log = logging.getLogger("aieng.bundle")


class PartialModelRefused(ValueError):
    """The current model stopped before max_steps and the config does not allow bundling it."""


def golden_limits(serving: dict[str, Any], prompts: int) -> dict[str, int]:
    """Engine limits for recording or replaying goldens: the bundle's own, except that every
    golden prompt may wait at once (max_waiting may be smaller than the prompt set)."""
    limits = {name: int(serving[name]) for name in ENGINE_LIMIT_FIELDS}
    limits["max_waiting"] = max(limits["max_waiting"], prompts)
    return limits


def kv_cache_bytes(model_config: Any, max_batch: int, max_context: int) -> int:
    """Bytes of the KV-cache pool the engine preallocates for these limits (measured on the
    meta device: the pool's own arithmetic, no memory allocated)."""
    from aieng_core.serving.kv_cache import KVCachePool

    return KVCachePool.for_model(model_config, max_batch, max_context, device="meta").nbytes


def produce_bundle_files(staging: Path, model_artifact: Artifact, serving: ServingConfig, threads: int) -> Produced:
    """Write a bundle of `model_artifact` into `staging`; needs nothing but the model
    artifact's directory and manifest (the serving benchmark bundles models of its own)."""
    from aieng_core.model.hf_files import checkpoint_config, load_model
    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.tokenizer.bpe import load_tokenizer

    # Each copy is hashed against the model's manifest: the bytes bundled are the bytes the
    # manifest names, whether the source was damaged before or changed during the copy.
    listed = model_artifact.manifest.get("files", {})
    for name in MODEL_FILES:
        source = model_artifact.path / name
        if name not in listed:
            raise ArtifactIntegrityError(f"{source}: not listed in {model_artifact.path / MANIFEST}")
        if not source.is_file():
            raise ArtifactIntegrityError(f"{source}: missing")
        shutil.copyfile(source, staging / name)
        if sha256_file(staging / name) != listed[name]:
            raise ArtifactIntegrityError(
                f"{source}: SHA-256 does not match the model's manifest (damaged, or changed while being copied)"
            )
    copied = Artifact(
        kind=MODEL_KIND,
        id=model_artifact.id,
        path=staging,
        manifest={"files": {name: model_artifact.manifest["files"][name] for name in MODEL_FILES}},
    )
    model_config = checkpoint_config(copied)
    if serving.max_context > model_config.max_position_embeddings:
        raise ValueError(
            f"serving.max_context ({serving.max_context}) exceeds the model's max_position_embeddings "
            f"({model_config.max_position_embeddings})"
        )
    settings = {name: getattr(serving, name) for name in SERVING_FIELDS}
    settings["warmup_prompt_lengths"] = list(serving.warmup_prompt_lengths)
    settings["eos_token_id"] = model_config.eos_token_id
    _write_json(staging / SERVING_FILE, settings)

    # Goldens come from the bytes just copied, through the engine that will serve them.
    limits = golden_limits(settings, len(serving.golden_prompts))
    with torch_threads(threads):
        model = load_model(copied, GOLDEN_DEVICE)
        engine = Engine(model, load_tokenizer(staging), EngineLimits(**limits), model_config.eos_token_id)
        outputs = record_goldens(engine, serving.golden_prompts, serving.golden_max_new_tokens)
    golden = {"device": GOLDEN_DEVICE, "threads": threads, "engine_limits": limits, "outputs": outputs}
    _write_json(staging / GOLDEN_FILE, golden)

    content = {name: sha256_file(staging / name) for name in BUNDLE_FILES}
    metrics = {
        "model_checkpoint_id": model_artifact.id,
        "parameters": model.num_parameters(),
        "eos_token_id": model_config.eos_token_id,
        "golden_prompts": len(outputs),
        "golden_max_new_tokens": serving.golden_max_new_tokens,
        "golden_threads": threads,
        "files": len(content),
        "bytes": sum((staging / name).stat().st_size for name in BUNDLE_FILES),
        "kv_cache_bytes": kv_cache_bytes(model_config, serving.max_batch, serving.max_context),
        **{name: settings[name] for name in ENGINE_LIMIT_FIELDS},
    }
    return Produced(content_sha256=bundle_content_sha256(content), metrics=metrics)


def bundle_content_sha256(file_hashes: dict[str, str]) -> str:
    """The bundle's content hash: of its files' hashes (the manifest and nothing else aside)."""
    return sha256_json(file_hashes)


def bundle_spec(config: AiengConfig, model: Artifact) -> ArtifactSpec:
    import torch

    # serving.threads 0 means torch's default, which follows the machine's cores; goldens
    # recorded with another thread count could differ in the last bit, so it is recipe.
    threads = config.serving.threads or torch.get_num_threads()
    return ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=config.section_sha256("serving"),
        inputs=((MODEL_KIND, model.id),),
        recipe={"device": GOLDEN_DEVICE, "threads": threads},
    )


def refuse_partial(model: Artifact, serving: ServingConfig) -> None:
    metrics = model.metrics
    if metrics.get("partial") and not serving.allow_partial_model:
        raise PartialModelRefused(
            f"{MODEL_KIND} {model.id} is a partial model: training stopped by max_minutes after "
            f"{metrics.get('steps')} of {metrics.get('max_steps')} steps. Finish training first "
            f"(`aieng model train`, or `dagster asset materialize -m orchestration.definitions --select "
            f"{MODEL_KIND}`: it resumes from step {metrics.get('steps')}), or set serving.allow_partial_model: "
            "true to bundle it anyway"
        )


def build_serving_bundle(
    store: ArtifactStore, config: AiengConfig, run: RunInfo = RunInfo(), logger: Any = log
) -> Artifact:
    """Bundle (or reuse the bundle of) the current model checkpoint."""
    model = store.check_input(store.require_current(MODEL_KIND))
    refuse_partial(model, config.serving)
    spec = bundle_spec(config, model)
    # Walked before building: a lineage with a hole (an upstream artifact gone) stops here.
    lineage = lineage_summary(store, model)

    def produce(staging: Path) -> Produced:
        produced = produce_bundle_files(staging, model, config.serving, spec.recipe["threads"])
        logger.info(f"{KIND}: bundled {MODEL_KIND} {model.id} with {produced.metrics['golden_prompts']} goldens")
        return replace(produced, extra={**produced.extra, "lineage": lineage})

    return store.build(spec, produce, run, logger)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
