"""serving_bundle: everything `aieng serve` needs, in one immutable, verifiable artifact.

The bundle holds the model (model.safetensors, config.json, generation_config.json), its
tokenizer files, serving.json (engine limits and request defaults from the `bundle:` config
section, plus the model's EOS id), golden.json (greedy continuations of the configured
prompts, recorded by the serving engine itself) and benchmark.json, the benchmark_report of
the same model (its figures are also in the manifest's metrics, under `benchmark`). Its
manifest lists every file's SHA-256, names the model checkpoint and the benchmark report as
its inputs, and carries a lineage summary found by walking the inputs chain down to the raw
snapshots. Same model + report + bundle config + code -> same id, reused. What only a
running server reads (the `serving:` section: queue length, timeouts, threads, device) is
not in the bundle and never changes its id.

The bundle is built from a report that exists; measuring one is the report's builder, and the
asset graph and `aieng bundle build` compose the two.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.bundle.golden import GOLDEN_DEVICE, record_goldens
from aieng_core.config import AiengConfig, BundleConfig
from aieng_core.faults import crash_point
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.serving.chat_template import ChatTemplate, with_template
from aieng_core.store import (
    Artifact,
    ArtifactIntegrityError,
    ArtifactNotFound,
    ArtifactSpec,
    ArtifactStore,
    Produced,
    RunInfo,
)
from aieng_core.store.artifacts import MANIFEST, rebuild_command
from aieng_core.store.lineage import lineage_summary
from aieng_core.tokenizer.bpe import TOKENIZER_CONFIG_FILE, TOKENIZER_FILES

# Spelled out (not imported from model/int8_weights.py) to keep torch out of this module's imports.
FP32, INT8 = "fp32", "int8"

# torch is imported inside the functions: the Dagster code location imports this module to
# define the asset, and loading the location must stay light.

KIND = asset_keys.SERVING_BUNDLE
# v3: carries the benchmark_report of its model (benchmark.json, metrics["benchmark"]), an input.
# v4: its recipe is the bundle: section; serving.json holds only it (what the server reads is not in it).
# v5: tokenizer_config.json carries bundle.chat_template; golden conversations rendered through it.
CODE_VERSION = "serving_bundle-v5"
MODEL_KIND = asset_keys.MODEL_CHECKPOINT
BENCHMARK_KIND = asset_keys.BENCHMARK_REPORT

# Spelled out (not imported from model/hf_files.py) to keep torch out of this module's imports.
MODEL_FILES = ("model.safetensors", "config.json", "generation_config.json", *TOKENIZER_FILES)
SERVING_FILE = "serving.json"
GOLDEN_FILE = "golden.json"
# What `aieng serve` loads: every bundle has these, and its content hash is of their hashes.
BUNDLE_FILES = (*MODEL_FILES, SERVING_FILE, GOLDEN_FILE)
# The benchmark report of the bundled model (its benchmark.json), copied byte for byte: listed
# in the manifest (so verified with every other file) but not served, so outside the content
# hash of what serves. Spelled out (not imported from aieng_core/benchmark/) as MODEL_FILES are.
BENCHMARK_FILE = "benchmark.json"

# The engine limits the bundle fixes (the KV-cache pool's size, what one step prefills) and the
# request defaults: the BundleConfig fields copied into serving.json, with the model's eos_token_id.
ENGINE_LIMIT_FIELDS = ("max_batch", "max_context", "max_prefill_tokens")
REQUEST_DEFAULT_FIELDS = ("default_max_new_tokens", "default_temperature", "default_top_k", "default_top_p")
SERVING_FIELDS = (*ENGINE_LIMIT_FIELDS, *REQUEST_DEFAULT_FIELDS)

log = logging.getLogger("aieng.bundle")


class PartialModelRefused(ValueError):
    """The current model stopped before max_steps and the config does not allow bundling it."""


class BenchmarkReportMismatch(ValueError):
    """The current benchmark report measured another model than the one the bundle would pack."""


def engine_for(
    model: Any,
    tokenizer: Any,
    serving: dict[str, Any],
    max_waiting: int,
    graphs: Any = None,
    bundle_key: str = "unbundled",
    prefix_cache_tokens: int = 0,
) -> Any:
    """The engine a bundle's serving.json describes, with a queue of `max_waiting`: the one way
    a bundle becomes an Engine (recording goldens, replaying them, serving). `graphs`
    (StepGraphSettings): how warmup captures its decode steps; None: never (goldens are
    recorded and replayed eagerly). `prefix_cache_tokens`: the server's prefix cache (0, goldens: none)."""
    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.serving.step_graphs import StepGraphSettings

    limits = EngineLimits(**{name: int(serving[name]) for name in ENGINE_LIMIT_FIELDS}, max_waiting=max_waiting)
    eos = int(serving["eos_token_id"])
    return Engine(model, tokenizer, limits, eos, graphs or StepGraphSettings(), bundle_key, prefix_cache_tokens)


def kv_cache_bytes(model_config: Any, max_batch: int, max_context: int) -> int:
    """Bytes of the KV-cache pool the engine preallocates for these limits (measured on the
    meta device: the pool's own arithmetic, no memory allocated)."""
    from aieng_core.serving.kv_cache import KVCachePool

    return KVCachePool.for_model(model_config, max_batch, max_context, device="meta").nbytes


def prefix_cache_bytes(model_config: Any, tokens: int) -> int:
    """Bytes of the prefix cache a server of `tokens` (serving.prefix_cache_tokens) preallocates."""
    from aieng_core.serving.kv_cache import KVCachePool
    from aieng_core.serving.prefix_cache import PrefixCache

    pool = KVCachePool.for_model(model_config, 1, 1, device="meta")
    return PrefixCache(pool, tokens, "sizing").nbytes


def produce_bundle_files(
    staging: Path, model_artifact: Artifact, recipe: BundleConfig, threads: int, benchmark: Artifact | None = None
) -> Produced:
    """Write a bundle of `model_artifact` into `staging`, with `benchmark` (its model's
    benchmark_report) when given; needs nothing but the artifacts' directories and manifests
    (the serving benchmark bundles models of its own, without a report)."""
    from aieng_core.model.hf_files import checkpoint_config, load_model
    from aieng_core.serving.device import torch_threads
    from aieng_core.tokenizer.bpe import load_tokenizer

    if benchmark is not None:
        refuse_other_model(benchmark, model_artifact)
    copy_verified(model_artifact, MODEL_FILES, staging, "the model's")
    if recipe.chat_template is not None:  # the tokenizer as served: with its chat template
        with_template(staging / TOKENIZER_CONFIG_FILE, recipe.chat_template)
    chat = ChatTemplate.of_directory(staging)
    crash_point("serving_bundle.model_copied")
    copied = Artifact(
        kind=MODEL_KIND,
        id=model_artifact.id,
        path=staging,
        manifest={"files": {name: model_artifact.manifest["files"][name] for name in MODEL_FILES}},
    )
    model_config = checkpoint_config(copied)
    if recipe.max_context > model_config.max_position_embeddings:
        raise ValueError(
            f"bundle.max_context ({recipe.max_context}) exceeds the model's max_position_embeddings "
            f"({model_config.max_position_embeddings})"
        )
    settings: dict[str, Any] = {name: getattr(recipe, name) for name in SERVING_FIELDS}
    settings["eos_token_id"] = model_config.eos_token_id
    write_json(staging / SERVING_FILE, settings)

    # Goldens come from the bytes just copied, through the engine that will serve them.
    prompts = recipe.golden_prompts
    conversations = [[turn.model_dump() for turn in turns] for turns in recipe.golden_conversations]
    with torch_threads(threads):
        model = load_model(copied, GOLDEN_DEVICE)
        engine = engine_for(model, load_tokenizer(staging), settings, max_waiting=len(prompts) + len(conversations))
        outputs = record_goldens(engine, prompts, conversations, chat, recipe.golden_max_new_tokens)
    # The limits the goldens were recorded with (every golden waiting at once: the queue's
    # length is the server's, and never shapes the batch), repeated for readers.
    golden = {"device": GOLDEN_DEVICE, "threads": threads, "engine_limits": asdict(engine.limits), "outputs": outputs}
    write_json(staging / GOLDEN_FILE, golden)

    written = list(BUNDLE_FILES)
    report_metrics: dict[str, Any] = {}
    if benchmark is not None:
        copy_verified(benchmark, (BENCHMARK_FILE,), staging, "the report's")
        written.append(BENCHMARK_FILE)
        report_metrics = {"benchmark_report_id": benchmark.id, "benchmark": benchmark.metrics}

    content = {name: sha256_file(staging / name) for name in BUNDLE_FILES}
    metrics = {
        "model_checkpoint_id": model_artifact.id,
        **report_metrics,
        "parameters": model.num_parameters(),
        "eos_token_id": model_config.eos_token_id,
        "golden_prompts": len(prompts),
        "golden_conversations": len(outputs) - len(prompts),
        # The chat template served (in tokenizer_config.json), by its hash; None: chat is refused.
        "chat_template_sha256": chat.sha256,
        "golden_max_new_tokens": recipe.golden_max_new_tokens,
        "golden_threads": threads,
        "files": len(written),
        "bytes": sum((staging / name).stat().st_size for name in written),
        "kv_cache_bytes": kv_cache_bytes(model_config, recipe.max_batch, recipe.max_context),
        **{name: settings[name] for name in ENGINE_LIMIT_FIELDS},
    }
    return Produced(content_sha256=bundle_content_sha256(content), metrics=metrics)


def report_model_id(report: Artifact) -> str | None:
    """The model_checkpoint a benchmark_report measured (its manifest's input)."""
    ids = report.input_ids(MODEL_KIND)
    return ids[0] if len(ids) == 1 else None


def refuse_other_model(report: Artifact, model: Artifact) -> None:
    measured = report_model_id(report)
    if measured != model.id:
        raise BenchmarkReportMismatch(
            f"{BENCHMARK_KIND} {report.id} measured {MODEL_KIND} {measured}, not {model.id}, the model this bundle "
            f"would pack: a bundle carries the report of its own model. Materialize {BENCHMARK_KIND} for it first "
            f"(`{rebuild_command(BENCHMARK_KIND, None)}`), then retry"
        )


def copy_verified(source: Artifact, names: Sequence[str], staging: Path, owner: str) -> None:
    """Copy files of `source` into `staging`, each hashed against `source`'s manifest (`owner`
    names it in errors) once copied: the bytes bundled are the bytes the manifest names,
    whether the source was damaged before or changed during the copy."""
    listed = source.manifest.get("files", {})
    for name in names:
        path = source.path / name
        if name not in listed:
            raise ArtifactIntegrityError(f"{path}: not listed in {source.path / MANIFEST}")
        if not path.is_file():
            raise ArtifactIntegrityError(f"{path}: missing")
        shutil.copyfile(path, staging / name)
        if sha256_file(staging / name) != listed[name]:
            raise ArtifactIntegrityError(
                f"{path}: SHA-256 does not match {owner} manifest (damaged, or changed while being copied)"
            )


def bundle_content_sha256(file_hashes: dict[str, str]) -> str:
    """The bundle's content hash: of the hashes of the files it serves (BUNDLE_FILES).
    benchmark.json is listed and verified like them, but decides nothing that serves."""
    return sha256_json(file_hashes)


def bundle_sections(config: AiengConfig) -> dict[str, Any]:
    """The bundle: section a bundle's id hashes, as recorded in its recipe. `weights` is left out
    when it is fp32, so the float32 bundles built before the key existed keep their ids (and an
    int8 variant's float32 source is hashed as any float32 bundle is)."""
    values = config.bundle.model_dump(mode="json")
    if values["weights"] == FP32:
        values.pop("weights")
    return {"bundle": values}


def bundle_config_sha256(config: AiengConfig) -> str:
    # One section is hashed bare, as config.section_sha256 does.
    return sha256_json(bundle_sections(config)["bundle"])


def as_fp32(config: AiengConfig) -> AiengConfig:
    """The config of an int8 variant's float32 source: the same, with bundle.weights fp32."""
    return config.model_copy(update={"bundle": config.bundle.model_copy(update={"weights": FP32})})


def golden_threads(config: AiengConfig) -> int:
    from aieng_core.cpu.quota import usable_cores

    # golden_threads 0 means the cores this process has (its CPU quota); goldens recorded with
    # another thread count could differ in the last bit, so it is recipe.
    return config.bundle.golden_threads or usable_cores()


def bundle_spec(config: AiengConfig, model: Artifact, report: Artifact) -> ArtifactSpec:
    threads = golden_threads(config)
    return ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=bundle_config_sha256(config),
        config_sections=bundle_sections(config),
        inputs=((MODEL_KIND, model.id), (BENCHMARK_KIND, report.id)),
        # A report's id is its recipe's, and its figures are measurements: its content hash names
        # the figures this bundle carries (a report measured again under the same id holds other figures).
        recipe={"device": GOLDEN_DEVICE, "threads": threads, "benchmark_report_sha256": report.content_sha256},
    )


def refuse_partial(model: Artifact, recipe: BundleConfig) -> None:
    metrics = model.metrics
    if metrics.get("partial") and not recipe.allow_partial_model:
        raise PartialModelRefused(
            f"{MODEL_KIND} {model.id} is a partial model: training stopped by max_minutes after "
            f"{metrics.get('steps')} of {metrics.get('max_steps')} steps. Finish training first "
            f"(`aieng model train`, or `dagster asset materialize -m orchestration.definitions --select "
            f"{MODEL_KIND}`: it resumes from step {metrics.get('steps')}), or set bundle.allow_partial_model: "
            "true to bundle it anyway"
        )


def build_serving_bundle(
    store: ArtifactStore, config: AiengConfig, run: RunInfo = RunInfo(), logger: Any = log
) -> Artifact:
    """Bundle (or reuse the bundle of) the current model checkpoint, with the current
    benchmark report, which must be of the same model; with bundle.weights int8, then its int8
    variant (bundle/int8_variant.py), which becomes the current bundle."""
    if config.bundle.weights == INT8:
        from aieng_core.bundle.int8_variant import build_int8_variant

        previous = store.current(KIND)
        source = build_serving_bundle(store, as_fp32(config), run, logger)
        try:
            return build_int8_variant(store, config, source, golden_threads(config), run, logger)
        except BaseException:
            # The float32 source stays in the store (the next try reuses it), but a config that
            # asks for int8 never leaves it current: the current bundle is what it was before.
            store.restore_current(KIND, previous)
            raise
    model = store.check_input(store.require_current(MODEL_KIND))
    refuse_partial(model, config.bundle)
    report = current_report(store)
    refuse_other_model(report, model)
    store.check_input(report)
    spec = bundle_spec(config, model, report)
    # Walked before building: a lineage with a hole (an upstream artifact gone) stops here. The
    # report's chain is the bundle's: the report, its model, and everything upstream of them.
    lineage = lineage_summary(store, report)

    def produce(staging: Path) -> Produced:
        produced = produce_bundle_files(staging, model, config.bundle, spec.recipe["threads"], report)
        logger.info(
            f"{KIND}: bundled {MODEL_KIND} {model.id} with {produced.metrics['golden_prompts']} golden prompts, "
            f"{produced.metrics['golden_conversations']} golden conversations and "
            f"{BENCHMARK_KIND} {report.id}"
        )
        # What renders a chat's prompt is part of what answered it, as the tokenizer is.
        chat = {"chat_template_sha256": produced.metrics["chat_template_sha256"]}
        return replace(produced, extra={**produced.extra, "lineage": {**lineage, **chat}})

    return store.build(spec, produce, run, logger)


def current_report(store: ArtifactStore) -> Artifact:
    report = store.current(BENCHMARK_KIND)
    if report is None:
        raise ArtifactNotFound(
            f"{BENCHMARK_KIND} has not been materialized yet: a bundle carries its model's benchmark report. "
            f"Materialize it first (`{rebuild_command(BENCHMARK_KIND, None)}`), then retry"
        )
    return report


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
