"""benchmark_report: the current model's quality, speed and memory, measured beside its peer."""

import base64

import dagster as dg

from aieng_core.benchmark import benchmark_report as report_core
from aieng_core.benchmark.summary import figures_markdown
from aieng_core.store import Artifact, ArtifactStore
from orchestration.assets.model import model_checkpoint
from orchestration.automation import follow_new_inputs
from orchestration.metadata import (
    inline_chart,
    materialize_one,
    numeric_order,
    run_info,
    validation_bits_per_byte,
)
from orchestration.partitions import single_run
from orchestration.resources import AiengResource


def plot_markdown(artifact: Artifact, name: str, title: str) -> dg.MetadataValue:
    """A PNG of the artifact, inline (a data URI), as the Dagster UI shows images in markdown."""
    png = base64.b64encode(artifact.file(name).read_bytes()).decode("ascii")
    return dg.MetadataValue.md(f"![{title}](data:image/png;base64,{png})")


def figure_metadata(metrics: dict) -> dict:
    """The report's headline figures (its manifest metrics) that Dagster can plot over time."""
    return {
        name: value
        for name, value in metrics.items()
        if isinstance(value, (bool, int, float, str)) and name != "truncated_reason"
    }


# What on-call reads first: the quality measured again, and the speed at each batch size and
# concurrency (summary.py names them).
HEADLINE_PREFIXES = ("tokens_per_second_batch_", "ttft_p99_ms_concurrency_")


def headline_metadata(report: dict, metrics: dict, store: ArtifactStore) -> dict:
    """Quality and speed figures, then the two inline charts (where short enough to show)."""
    headline: dict = {}
    if isinstance(metrics.get("validation_loss"), float):  # absent when the report was truncated before it
        headline["validation_loss"] = metrics["validation_loss"]
        headline |= validation_bits_per_byte(store, metrics["model_checkpoint_id"], metrics["validation_loss"])
    speed = sorted((name for name in metrics if name.startswith(HEADLINE_PREFIXES)), key=numeric_order)
    headline.update({name: metrics[name] for name in speed})
    charts = {
        "throughput_chart": inline_chart(
            [(str(row["batch_size"]), row["ours"]["tokens_per_second"]) for row in report["throughput"]],
            "generated tokens/s by batch size (our engine)",
        ),
        "ttft_p99_chart": inline_chart(
            [(str(level["concurrency"]), level["ttft_ms"]["p99"]) for level in report["latency"]],
            "P99 time to first token (ms) by requests in flight",
        ),
    }
    return {**headline, **{name: chart for name, chart in charts.items() if chart is not None}}


@dg.asset(
    key=report_core.KIND,
    deps=[model_checkpoint],
    automation_condition=follow_new_inputs(),
    backfill_policy=single_run,
    code_version=report_core.CODE_VERSION,
    group_name="evaluation",
    kinds={"pytorch"},
    description=(
        "The current model measured on CPU: validation loss and perplexity (measured again through the stored "
        "weights) against the unigram baseline, golden continuations, tokens/s through our engine at each "
        "benchmark.batch_sizes with transformers generate on the same weights beside it, TTFT/TPOT/ITL/E2EL "
        "P50/P99 at each benchmark.concurrencies, and peak RSS against the memory budget rule. It measures this "
        "model only (the comparison with the deployed bundle is the gate's compare step). Stops (truncated=true) "
        "once benchmark.max_seconds has run out."
    ),
)
def benchmark_report(context: dg.AssetExecutionContext, aieng: AiengResource) -> dg.MaterializeResult:
    store = aieng.store()
    artifact = report_core.build_benchmark_report(store, aieng.settings(), run_info(context), context.log)
    report = report_core.read_report(artifact)
    described = {
        **figure_metadata(artifact.metrics),
        "figures": dg.MetadataValue.md(figures_markdown(report)),
        "throughput_plot": plot_markdown(artifact, report_core.THROUGHPUT_PLOT, "throughput"),
        "latency_plot": plot_markdown(artifact, report_core.LATENCY_PLOT, "latency"),
    }
    if report["truncated"]:
        described["truncated_reason"] = dg.MetadataValue.text(report["truncated_reason"])
    return materialize_one(artifact, described, headline=headline_metadata(report, artifact.metrics, store))
