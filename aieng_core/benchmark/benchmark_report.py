"""benchmark_report: how good, how fast and how big the current model is, measured.

Quality: validation loss measured again through the stored weights on the dataset manifest's
validation windows (those training evaluated), against the unigram baseline, and greedy
continuations of the golden prompts through the serving engine. Speed: tokens/s through our
engine at each configured batch size, with transformers `generate` on the same weights,
prompts and lengths beside it; latency (TTFT, TPOT, ITL, E2EL) against the requests kept in
flight through the threaded engine loop. Memory: this process's peak RSS against the budget
rule. Everything runs on CPU, in process.

The report measures one model and nothing else: what production serves decides nothing in
it (its id names every input, and no hidden one may decide its bytes). Comparing a candidate
with the deployed bundle is the promotion gate's question (gate/compare.py).

The artifact holds benchmark.json (every figure), throughput.png and latency.png. Its id
is the recipe's (model, dataset, the benchmark, bundle and training sections, code version):
timings are measurements, not recipe, so the same recipe is reused as it was measured.
Measuring stops once `benchmark.max_seconds` has run out; such a report says what it lacks
(`truncated`, `truncated_reason`, `skipped`) and is published under an id of its own, so it
never takes the complete report's id and the next materialization measures again.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.benchmark.budget import TimeBudget
from aieng_core.benchmark.summary import summary_metrics
from aieng_core.config import AiengConfig
from aieng_core.cpu.quota import usable_cores
from aieng_core.faults import crash_point
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactSpec, ArtifactStore, Produced, RunInfo

# torch, transformers and matplotlib are imported inside the functions: the Dagster code
# location imports this module to define the asset, and loading the location must stay light.

KIND = asset_keys.BENCHMARK_REPORT
# v2: measures the model alone; the comparison with the deployed bundle moved to the gate.
CODE_VERSION = "benchmark_report-v3"
MODEL_KIND = asset_keys.MODEL_CHECKPOINT
DATASET_KIND = asset_keys.DATASET_MANIFEST
REPORT_FILE = "benchmark.json"
THROUGHPUT_PLOT = "throughput.png"
LATENCY_PLOT = "latency.png"
REPORT_FILES = (REPORT_FILE, THROUGHPUT_PLOT, LATENCY_PLOT)
DEVICE = "cpu"

log = logging.getLogger("aieng.benchmark")


class _Truncated(Exception):
    """Raised out of the complete recipe's build, so a truncated report never takes its id."""

    def __init__(self, report: dict[str, Any]) -> None:
        super().__init__(report["truncated_reason"])
        self.report = report


def engine_limits(config: AiengConfig) -> dict[str, int]:
    """The engine the report measures: the bundle's context and prefill limit, with a slot for
    every sequence of the largest batch or concurrency level."""
    bench = config.benchmark
    largest = max((*bench.batch_sizes, *bench.concurrencies))
    limits = {
        "max_batch": largest,
        "max_context": config.bundle.max_context,
        "max_waiting": max(largest, len(config.bundle.golden_prompts)),
        "max_prefill_tokens": config.bundle.max_prefill_tokens,
    }
    if bench.prompt_tokens + bench.new_tokens > limits["max_context"]:
        raise ValueError(
            f"benchmark.prompt_tokens ({bench.prompt_tokens}) + benchmark.new_tokens ({bench.new_tokens}) exceeds "
            f"bundle.max_context ({limits['max_context']})"
        )
    return limits


def dataset_of(store: ArtifactStore, model: Artifact) -> Artifact:
    """The dataset_manifest the model was trained on (its manifest's input), verified."""
    ids = model.input_ids(DATASET_KIND)
    if len(ids) != 1:
        raise ArtifactIntegrityError(
            f"{MODEL_KIND} {model.id} names {len(ids)} {DATASET_KIND} inputs in its manifest, not one"
        )
    return store.check_input(store.get(DATASET_KIND, ids[0]))


# The bundle: keys the report reads (the engine's context and prefill, the golden prompts): a
# request default or the goldens' thread count decides nothing here.
BUNDLE_KEYS = ("max_context", "max_prefill_tokens", "golden_prompts", "golden_max_new_tokens")
INT8 = "int8"


def measures_int8(config: AiengConfig) -> bool:
    """bundle.weights int8: the report measures the model's int8 variant beside it."""
    return config.bundle.weights == INT8


def report_config_sha256(config: AiengConfig) -> str:
    """benchmark: what is measured; training: the validation windows (block_size, batch_size,
    eval_batches); bundle: BUNDLE_KEYS."""
    recipe = config.bundle.model_dump(mode="json")
    # bundle.weights only when int8 (the int8 side is measured too): the reports of float32
    # bundles keep the ids they had before the key existed.
    keys = (*BUNDLE_KEYS, "weights") if measures_int8(config) else BUNDLE_KEYS
    return sha256_json(
        {
            "benchmark": config.benchmark.model_dump(mode="json"),
            "bundle": {key: recipe[key] for key in keys},
            "training": config.training.model_dump(mode="json"),
        }
    )


def report_spec(config: AiengConfig, model: Artifact, dataset: Artifact) -> ArtifactSpec:
    return ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=report_config_sha256(config),
        config_sections=config.section_values("benchmark", "bundle", "training"),
        inputs=((MODEL_KIND, model.id), (DATASET_KIND, dataset.id)),
        recipe={"device": DEVICE},
    )


def build_benchmark_report(
    store: ArtifactStore,
    config: AiengConfig,
    run: RunInfo = RunInfo(),
    logger: Any = log,
    clock: Callable[[], float] = time.monotonic,
) -> Artifact:
    """Measure (or reuse the report of) the current model checkpoint; `clock` (seconds) is what
    `benchmark.max_seconds` is measured on."""
    model = store.check_input(store.require_current(MODEL_KIND))
    dataset = dataset_of(store, model)
    engine_limits(config)  # a benchmark that cannot fit the engine stops before anything is loaded
    spec = report_spec(config, model, dataset)

    def produce(staging: Path) -> Produced:
        report = measure(config, model, dataset, logger, clock)
        if report["truncated"]:
            raise _Truncated(report)
        return write_report(staging, report)

    try:
        artifact = store.build(spec, produce, run, logger)
    except _Truncated as stopped:
        report = stopped.report
        truncated = replace(spec, recipe={**spec.recipe, "truncated": True})
        artifact = store.build(truncated, lambda staging: write_report(staging, report), run, logger)
        logger.warning(
            f"{KIND}: truncated: {report['truncated_reason']}; published as {artifact.id} (a complete "
            f"report would be {spec.artifact_id()}: raise benchmark.max_seconds, or materialize again)"
        )
        return artifact
    verb = "reused" if artifact.reused else "measured"
    logger.info(f"{KIND}: {verb} {artifact.id} for {MODEL_KIND} {model.id} ({artifact.metrics['seconds']:.1f} s)")
    return artifact


def read_report(artifact: Artifact) -> dict[str, Any]:
    return json.loads(artifact.file(REPORT_FILE).read_text(encoding="utf-8"))


def write_report(staging: Path, report: dict[str, Any]) -> Produced:
    from aieng_core.benchmark.plots import latency_png, throughput_png

    text = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
    (staging / REPORT_FILE).write_text(text + "\n", encoding="utf-8")
    crash_point("benchmark_report.json_written")
    (staging / THROUGHPUT_PLOT).write_bytes(throughput_png(report))
    (staging / LATENCY_PLOT).write_bytes(latency_png(report))
    content = {name: sha256_file(staging / name) for name in REPORT_FILES}
    return Produced(content_sha256=sha256_json(content), metrics=summary_metrics(report))


def int8_side(
    config: AiengConfig,
    model: Any,
    dataset: Artifact,
    model_artifact: Artifact,
    tokenizer: Any,
    limits: dict[str, int],
    golden: list[dict[str, Any]] | None,
    budget: TimeBudget,
    logger: Any,
) -> dict[str, Any] | None:
    """With bundle.weights int8: the int8 variant of the model (quantized in memory, exactly
    as the variant bundle stores it), its validation loss and greedy agreement on the golden
    prompts; its engine (under "engine") joins the throughput rows as a peer. None otherwise."""
    if not measures_int8(config) or not budget.allows("int8 variant"):
        return None
    from aieng_core.benchmark.quality import validation_quality
    from aieng_core.model.int8_weights import METHOD, quantized_copy
    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.serving.greedy import golden_agreement, greedy_continuations

    quantized = quantized_copy(model)
    quality = validation_quality(quantized, dataset, config.training, model_artifact.metrics)
    engine = Engine(quantized, tokenizer, EngineLimits(**limits), model.config.eos_token_id)
    agreement = None
    if golden is not None:
        recipe = config.bundle
        outputs = greedy_continuations(engine, recipe.golden_prompts, recipe.golden_max_new_tokens)
        agreement = golden_agreement(golden, outputs)
    logger.info(f"{KIND}: int8 variant: validation loss {quality['validation_loss']:.4f} nats/token")
    return {"method": METHOD, "quality": quality, "golden_agreement": agreement, "engine": engine}


def int8_row(figures: dict[str, Any], outputs: dict[str, list[list[int]]]) -> dict[str, Any]:
    """The int8 peer's figures in a throughput row, beside the float32 engine's."""
    from aieng_core.benchmark import speed

    return {
        "int8": figures["int8"],
        "ratio_int8_vs_ours": figures["int8"]["tokens_per_second"] / figures["ours"]["tokens_per_second"],
        "int8_matching_outputs": speed.matching(outputs["ours"], outputs["int8"]),
    }


def measure(
    config: AiengConfig,
    model_artifact: Artifact,
    dataset: Artifact,
    logger: Any = log,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Every figure of the report (benchmark.json's content), within benchmark.max_seconds."""
    import torch

    from aieng_core.benchmark import speed
    from aieng_core.benchmark.latency import DEFINITIONS, latency_level
    from aieng_core.benchmark.memory_use import memory_figures
    from aieng_core.benchmark.quality import validation_quality
    from aieng_core.model.hf_files import load_model
    from aieng_core.serving.device import torch_threads
    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.serving.greedy import greedy_continuations
    from aieng_core.tokenizer.bpe import load_tokenizer

    started = time.perf_counter()
    bench, recipe = config.benchmark, config.bundle
    budget = TimeBudget(bench.max_seconds, clock)
    limits = engine_limits(config)
    threads = bench.threads or usable_cores()  # 0: the cores this process has (cpu/quota.py)
    transformers_version: str | None = None

    with torch_threads(threads):
        model = load_model(model_artifact, DEVICE)
        parameters = model.num_parameters()
        quality = None
        if budget.allows("validation loss"):
            quality = validation_quality(model, dataset, config.training, model_artifact.metrics)
            logger.info(
                f"{KIND}: validation loss {quality['validation_loss']:.4f} vs unigram baseline "
                f"{quality['unigram_baseline_loss']:.4f} nats/token"
            )
        tokenizer = load_tokenizer(model_artifact.path)
        eos = model.config.eos_token_id
        engine = Engine(model, tokenizer, EngineLimits(**limits), eos)
        golden = None
        if budget.allows("golden continuations"):
            golden = greedy_continuations(engine, recipe.golden_prompts, recipe.golden_max_new_tokens)
        int8 = int8_side(config, model, dataset, model_artifact, tokenizer, limits, golden, budget, logger)
        int8_peer = speed.engine_generate(int8.pop("engine")) if int8 is not None else None

        ours = speed.engine_generate(engine)
        hf_generate: speed.Generate | None = None
        throughput = []
        for size in bench.batch_sizes:
            if not budget.allows(f"throughput at batch {size}"):
                continue
            prompts = speed.benchmark_prompts(engine.encode, eos, size, bench.prompt_tokens)
            peers = {"ours": (ours, prompts)}
            if int8_peer is not None:
                peers["int8"] = (int8_peer, prompts)
            if bench.compare_transformers:
                if hf_generate is None:
                    import transformers

                    transformers_version = transformers.__version__
                    hf_model = speed.load_transformers_model(model_artifact.path)
                    hf_generate = speed.transformers_generate(hf_model, model.config.pad_token_id)
                peers["transformers"] = (hf_generate, prompts)
            figures, outputs = speed.side_by_side(peers, bench.new_tokens)
            theirs = figures.get("transformers")
            throughput.append(
                {
                    "batch_size": size,
                    "ours": figures["ours"],
                    "transformers": theirs,
                    "ratio_vs_transformers": (
                        figures["ours"]["tokens_per_second"] / theirs["tokens_per_second"] if theirs else None
                    ),
                    "matching_outputs": speed.matching(outputs["ours"], outputs["transformers"]) if theirs else None,
                    **(int8_row(figures, outputs) if int8_peer is not None else {}),
                }
            )
            logger.info(
                f"{KIND}: batch {size}: {figures['ours']['tokens_per_second']:,.0f} tok/s"
                + (f" vs transformers {theirs['tokens_per_second']:,.0f} tok/s" if theirs else "")
            )

        latency = []
        for concurrency in bench.concurrencies:
            if not budget.allows(f"latency at concurrency {concurrency}"):
                continue
            prompts = speed.benchmark_prompts(engine.encode, eos, bench.requests_per_level, bench.prompt_tokens)
            ours(prompts[:concurrency], speed.WARMUP_NEW_TOKENS)
            level = latency_level(engine, prompts, bench.new_tokens, concurrency, bench.max_seconds)
            latency.append(level)
            logger.info(
                f"{KIND}: {concurrency} in flight: TTFT P99 {level['ttft_ms']['p99']:.1f} ms, "
                f"TPOT P99 {level['tpot_ms']['p99']:.1f} ms"
            )

        memory = memory_figures(parameters)

    return {
        "model_checkpoint_id": model_artifact.id,
        "model_partial": bool(model_artifact.metrics.get("partial")),
        "parameters": parameters,
        "environment": {
            "device": DEVICE,
            "threads": threads,
            "torch": torch.__version__,
            "transformers": transformers_version,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "settings": {
            **bench.model_dump(mode="json"),
            "repeats": speed.REPEATS,
            "warmup_new_tokens": speed.WARMUP_NEW_TOKENS,
            "engine_limits": limits,
        },
        "quality": quality,
        "golden": golden,
        "throughput": throughput,
        "latency": latency,
        "latency_definitions": DEFINITIONS,
        "memory": memory,
        "truncated": budget.truncated,
        "truncated_reason": budget.reason(),
        "skipped": budget.skipped,
        "seconds": time.perf_counter() - started,
        # Only with bundle.weights int8: a float32 report has exactly the keys it had before.
        **({"int8": int8} if int8 is not None else {}),
    }
