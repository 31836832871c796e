"""serving_bundle: the model, tokenizer, serving limits and golden outputs `aieng serve` loads."""

from typing import Any

import dagster as dg

from aieng_core.benchmark.summary import figures_markdown
from aieng_core.bundle import serving_bundle as bundle_core
from aieng_core.store import ArtifactStore
from orchestration.assets.benchmark import HEADLINE_PREFIXES, benchmark_report
from orchestration.automation import follow_new_inputs
from orchestration.metadata import materialize_one, numeric_order, run_info, validation_bits_per_byte
from orchestration.partitions import single_run
from orchestration.resources import AiengResource


def golden_table(outputs: list[dict[str, Any]]) -> str:
    """The golden continuations as a markdown table (prompt, tokens, text, finish reason)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "\\n")

    rows = [
        f"| {cell(o['prompt'])} | {len(o['token_ids'])} | {cell(o['text'])} | {o.get('finish_reason')} |"
        for o in outputs
    ]
    return "\n".join(["| prompt | tokens | greedy continuation | finish |", "|---|---|---|---|", *rows])


@dg.asset(
    key=bundle_core.KIND,
    deps=[benchmark_report],
    automation_condition=follow_new_inputs(),
    backfill_policy=single_run,
    code_version=bundle_core.CODE_VERSION,
    group_name="serving",
    kinds={"pytorch", "safetensors"},
    description=(
        "Immutable bundle `aieng serve` loads: the current model's safetensors and config, its tokenizer, "
        "serving.json (engine limits and request defaults from the bundle: config, its recipe) and golden greedy "
        "continuations recorded by the serving engine, and benchmark.json, the benchmark_report of the same model "
        "(a report of another model is refused). Its manifest's inputs chain reaches the raw snapshots. What only "
        "the server reads (the serving: config) is not in it. A partial model is refused unless "
        "bundle.allow_partial_model."
    ),
)
def serving_bundle(context: dg.AssetExecutionContext, aieng: AiengResource) -> dg.MaterializeResult:
    import json

    artifact = bundle_core.build_serving_bundle(aieng.store(), aieng.settings(), run_info(context), context.log)
    context.log.info(f"serving_bundle: {'reused' if artifact.reused else 'built'} {artifact.id}")
    metrics = artifact.metrics
    golden = json.loads(artifact.file(bundle_core.GOLDEN_FILE).read_text(encoding="utf-8"))
    serving = json.loads(artifact.file(bundle_core.SERVING_FILE).read_text(encoding="utf-8"))
    benchmark = json.loads(artifact.file(bundle_core.BENCHMARK_FILE).read_text(encoding="utf-8"))
    lineage = artifact.manifest.get("lineage", {})
    return materialize_one(
        artifact,
        {
            "model_checkpoint_id": metrics["model_checkpoint_id"],
            "benchmark_report_id": metrics["benchmark_report_id"],
            "parameters": metrics["parameters"],
            "files": metrics["files"],
            "bytes": metrics["bytes"],
            "kv_cache_bytes": metrics["kv_cache_bytes"],
            "golden_prompts": metrics["golden_prompts"],
            "golden_conversations": metrics.get("golden_conversations", 0),
            # None for a bundle without a template (it answers no chat), or one built before templates.
            "chat_template_sha256": metrics.get("chat_template_sha256") or "none",
            "golden_outputs": dg.MetadataValue.md(golden_table(golden["outputs"])),
            "benchmark": dg.MetadataValue.md(figures_markdown(benchmark)),
            "benchmark_metrics": dg.MetadataValue.json(metrics["benchmark"]),
            "serving_limits": dg.MetadataValue.json(serving),
            "lineage": dg.MetadataValue.json(lineage),
            "serve_command": dg.MetadataValue.text(f"aieng serve --bundle {artifact.path}"),
            "weights": metrics.get("weights", "fp32"),
            **variant_metadata(metrics),
        },
        headline=bundle_headline(artifact.id, metrics, aieng.store()),
    )


def variant_metadata(metrics: dict[str, Any]) -> dict[str, Any]:
    """An int8 variant's source, method, agreement and quality figures; nothing for float32."""
    if metrics.get("weights") != "int8":
        return {}
    quality = metrics["int8_quality"]
    return {
        "source_bundle_id": metrics["source_bundle_id"],
        "weights_method": metrics["weights_method"],
        "golden_agreement": dg.MetadataValue.json(metrics["golden_agreement"]),
        "fp32_bits_per_byte": quality["fp32_bits_per_byte"],
        "int8_bits_per_byte": quality["int8_bits_per_byte"],
        "model_bytes": metrics["model_bytes"],
        "source_model_bytes": metrics["source_model_bytes"],
    }


def bundle_headline(bundle_id: str, metrics: dict[str, Any], store: ArtifactStore) -> dict[str, Any]:
    """The bundle's id (what `aieng deploy promote` takes), then the figures of the benchmark it
    carries (its validation loss in bits per byte too), as numbers the UI plots bundle after bundle."""
    figures = metrics.get("benchmark") or {}
    quality = {name: figures[name] for name in ("validation_loss",) if name in figures}
    if "validation_loss" in quality:
        quality |= validation_bits_per_byte(store, metrics["model_checkpoint_id"], quality["validation_loss"])
    names = sorted((n for n in figures if n.startswith(HEADLINE_PREFIXES)), key=numeric_order)
    speed = {name: figures[name] for name in names}
    return {"bundle_id": bundle_id, **quality, **speed, "parameters": metrics["parameters"]}


@dg.asset_check(
    asset=serving_bundle,
    blocking=True,
    description=(
        "`aieng bundle verify` on the current bundle: every file matches the manifest, the model loads, "
        "and the serving engine replays every golden prompt to the recorded tokens."
    ),
)
def bundle_verified(aieng: AiengResource) -> dg.AssetCheckResult:
    from aieng_core.bundle.verify import verify_bundle

    artifact = aieng.store().require_current(serving_bundle.key.to_user_string())
    report = verify_bundle(artifact.path)
    return dg.AssetCheckResult(
        passed=report["ok"],
        description="; ".join(report["problems"][:3]) or None,
        metadata={
            "bundle_id": artifact.id,
            "files_checked": report["files_checked"],
            "goldens_replayed": len(report["goldens"]),
            "goldens_matching": sum(1 for golden in report["goldens"] if golden["ok"]),
            "problems": dg.MetadataValue.json(report["problems"]),
        },
    )


@dg.asset_check(
    asset=serving_bundle,
    blocking=True,
    description=(
        "An int8 variant (bundle.weights: int8) against its float32 source: refused when its bits per byte on the "
        "held-out text is worse by more than gate.int8_max_quality_regression (the gate decides the same); reports "
        "greedy agreement with the float32 goldens. A float32 bundle passes: nothing is quantized."
    ),
)
def int8_within_quality_margin(aieng: AiengResource) -> dg.AssetCheckResult:
    from aieng_core.bundle.int8_variant import int8_refusal, measured_int8_quality, serves_int8
    from aieng_core.bundle.verify import load_bundle

    store = aieng.store()
    artifact = store.require_current(serving_bundle.key.to_user_string())
    loaded = load_bundle(artifact.path, check_goldens=False)  # re-hashed: serving.json says what it is
    if not serves_int8(loaded):
        return dg.AssetCheckResult(
            passed=True, description="a float32 bundle: nothing quantized", metadata={"bundle_id": artifact.id}
        )
    margin = aieng.settings().gate.int8_max_quality_regression
    quality = measured_int8_quality(store, loaded)  # both models scored again, not the recorded figures
    refusal = int8_refusal(quality, margin)
    agreement = artifact.metrics.get("golden_agreement") or {}
    return dg.AssetCheckResult(
        passed=refusal is None,
        description=refusal,
        metadata={
            "bundle_id": artifact.id,
            "source_bundle_id": quality["source_bundle_id"],
            "weights_method": loaded.serving.get("weights_method", ""),
            "fp32_bits_per_byte": quality["fp32_bits_per_byte"],
            "int8_bits_per_byte": quality["int8_bits_per_byte"],
            "worse_by": quality["worse_by"],
            "margin": margin,
            "goldens_identical": agreement.get("identical", 0),
            "golden_prompts": agreement.get("prompts", 0),
            "golden_token_agreement": agreement.get("token_agreement", float("nan")),
        },
    )


CHECKS = [bundle_verified, int8_within_quality_margin]
