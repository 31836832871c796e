"""benchmark_report between model_checkpoint and serving_bundle, materialized by Dagster.

The trained tiny home is copied without any report or bundle, then model_checkpoint (reused),
benchmark_report and serving_bundle are materialized twice with a real instance: the report's
metadata shows its figures and plots, and the bundle names the report as an input and carries it.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from aieng_core.benchmark import benchmark_report as report_core
from aieng_core.benchmark.summary import figures_markdown
from aieng_core.bundle import serving_bundle as bundle_core
from aieng_core.store import ArtifactStore
from orchestration.assets.benchmark import benchmark_report
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import serving_bundle
from orchestration.resources import AiengResource
from tests.conftest import TINY_CONFIG
from tests.orchestration.helpers import TINY_BENCHMARK_HEADLINES, meta, run_materializations

GRAPH = [model_checkpoint, benchmark_report, serving_bundle]


@dataclass
class Materialized:
    home: Path
    first: dg.ExecuteInProcessResult
    again: dg.ExecuteInProcessResult

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.home)


@pytest.fixture(scope="module")
def materialized(trained_home, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Materialized]:
    home = tmp_path_factory.mktemp("benchmark-graph") / "aieng-home"
    shutil.copytree(trained_home.home, home)
    # Other tests may have measured or bundled the shared home already: this run must build its own.
    for kind in (report_core.KIND, bundle_core.KIND):
        shutil.rmtree(home / "artifacts" / kind, ignore_errors=True)
        shutil.rmtree(home / "refs" / kind, ignore_errors=True)
    resources = {"aieng": AiengResource(home=str(home), config_path=str(TINY_CONFIG))}
    with dg.instance_for_test() as instance:
        first = dg.materialize(GRAPH, instance=instance, resources=resources)
        again = dg.materialize(GRAPH, instance=instance, resources=resources)
        yield Materialized(home, first, again)


def inline_png(path: Path, title: str) -> str:
    return f"![{title}](data:image/png;base64,{base64.b64encode(path.read_bytes()).decode('ascii')})"


def test_the_three_assets_materialize_and_are_reused(materialized: Materialized, trained_home) -> None:
    keys = {("model_checkpoint", None), ("benchmark_report", None), ("serving_bundle", None)}
    for result in (materialized.first, materialized.again):
        assert result.success
        assert set(run_materializations(result)) == keys
    first, again = run_materializations(materialized.first), run_materializations(materialized.again)
    for key in ("benchmark_report", "serving_bundle"):
        before, after = meta(first[(key, None)]), meta(again[(key, None)])
        assert (before["reused"], after["reused"]) == (False, True), key
        assert before["artifact_id"] == after["artifact_id"], key
    report = materialized.store.require_current(report_core.KIND)
    assert report.manifest["inputs"][0] == {"kind": "model_checkpoint", "id": trained_home.model.id}
    assert report.manifest["dagster_run_id"] == materialized.first.run_id


def test_report_metadata_has_the_figures_table_and_the_plots(materialized: Materialized) -> None:
    artifact = materialized.store.require_current(report_core.KIND)
    materialization = run_materializations(materialized.first)[("benchmark_report", None)]
    values = meta(materialization)
    report = report_core.read_report(artifact)
    assert values["artifact_id"] == artifact.id
    assert values["content_sha256"] == artifact.content_sha256
    assert materialization.tags["dagster/data_version"] == artifact.content_sha256
    assert values["figures"] == figures_markdown(report)
    assert values["figures"].splitlines()[0].startswith("| validation loss | perplexity |")
    assert values["throughput_plot"] == inline_png(artifact.file(report_core.THROUGHPUT_PLOT), "throughput")
    assert values["latency_plot"] == inline_png(artifact.file(report_core.LATENCY_PLOT), "latency")
    assert materialization.metadata["figures"] == dg.MetadataValue.md(values["figures"])
    for name in ("validation_loss", "tokens_per_second_batch_4", "ratio_vs_transformers_batch_1", "peak_rss_bytes"):
        assert values[name] == artifact.metrics[name], name
    assert values["ttft_p99_ms_concurrency_4"] == report["latency"][1]["ttft_ms"]["p99"]
    assert values["truncated"] is False
    assert "truncated_reason" not in values
    # The report measures one model: nothing of what production serves is in it.
    assert not [name for name in values if "deployed" in name]


def test_the_bundle_names_and_carries_the_report(materialized: Materialized, trained_home) -> None:
    store = materialized.store
    report, bundle = store.require_current(report_core.KIND), store.require_current(bundle_core.KIND)
    assert bundle.manifest["inputs"] == [
        {"kind": "model_checkpoint", "id": trained_home.model.id},
        {"kind": "benchmark_report", "id": report.id},
    ]
    assert bundle.file(bundle_core.BENCHMARK_FILE).read_bytes() == report.file(report_core.REPORT_FILE).read_bytes()
    values = meta(run_materializations(materialized.first)[("serving_bundle", None)])
    assert values["input_ids"] == f"{trained_home.model.id}, {report.id}"
    assert values["benchmark_report_id"] == report.id
    assert values["benchmark"] == figures_markdown(report_core.read_report(report))
    assert json.loads(json.dumps(values["benchmark_metrics"])) == report.metrics


def test_quality_and_speed_come_first_with_inline_charts(materialized: Materialized) -> None:
    from aieng_core.training.bits_per_byte import bits_per_byte, tokens_per_byte
    from orchestration.metadata import INLINE_MARKDOWN_CHARS

    store = materialized.store
    artifact = store.require_current(report_core.KIND)
    values = meta(run_materializations(materialized.first)[("benchmark_report", None)])
    metrics = artifact.metrics
    # configs/tiny.yaml: batch sizes 1 and 4, concurrencies 1 and 4.
    assert list(values)[:8] == TINY_BENCHMARK_HEADLINES
    model = store.get("model_checkpoint", metrics["model_checkpoint_id"])
    assert values["validation_bits_per_byte"] == bits_per_byte(
        metrics["validation_loss"], tokens_per_byte(model, store)
    )
    for name in ("throughput_chart", "ttft_p99_chart"):
        chart = values[name]
        # Short enough for the UI to render it in the table, and an image it can show.
        assert len(chart) < INLINE_MARKDOWN_CHARS, name
        encoded = chart.split("data:image/svg+xml;base64,", 1)[1].split(")", 1)[0]
        svg = base64.b64decode(encoded).decode("utf-8")
        assert svg.startswith("<svg xmlns='http://www.w3.org/2000/svg'") and svg.endswith("</svg>"), name
    report = report_core.read_report(artifact)
    throughput_svg = base64.b64decode(values["throughput_chart"].split(",", 1)[1].split(")", 1)[0]).decode()
    for row in report["throughput"]:  # each bar's value is written above it
        assert f">{row['ours']['tokens_per_second']:,.0f}<" in throughput_svg or row["ours"]["tokens_per_second"] < 100


def test_the_bundle_shows_its_id_and_the_benchmark_figures_first(materialized: Materialized) -> None:
    store = materialized.store
    bundle = store.require_current(bundle_core.KIND)
    values = meta(run_materializations(materialized.first)[("serving_bundle", None)])
    figures = bundle.metrics["benchmark"]
    # The benchmark's quality and speed rows (not its charts) between the id and the size.
    assert list(values)[:8] == ["bundle_id", *TINY_BENCHMARK_HEADLINES[:6], "parameters"]
    assert values["bundle_id"] == bundle.id == values["artifact_id"]
    for name in ["validation_loss", *list(values)[3:7]]:
        assert values[name] == figures[name] and isinstance(values[name], float), name
    report = meta(run_materializations(materialized.first)[("benchmark_report", None)])
    assert values["validation_bits_per_byte"] == report["validation_bits_per_byte"]  # the same model


def test_the_chart_row_is_inline_sized_or_absent() -> None:
    from orchestration.metadata import INLINE_MARKDOWN_CHARS, inline_chart

    few = inline_chart([(str(n), 1000.0 * n) for n in (1, 16, 64)], "tokens/s by batch size")
    assert few is not None and len(few.value) < INLINE_MARKDOWN_CHARS
    assert few.value.startswith("![tokens/s by batch size](data:image/svg+xml;base64,")
    assert few.value.endswith(")\n\ntokens/s by batch size")
    assert inline_chart([(str(n), 1000.0 * n) for n in range(1, 20)], "too many bars") is None
    assert inline_chart([], "nothing measured") is None


def test_figures_per_size_come_in_numeric_order() -> None:
    from orchestration.metadata import numeric_order

    names = ["ttft_p99_ms_concurrency_16", "ttft_p99_ms_concurrency_4", "tokens_per_second_batch_1"]
    assert sorted(names, key=numeric_order) == [
        "tokens_per_second_batch_1",
        "ttft_p99_ms_concurrency_4",
        "ttft_p99_ms_concurrency_16",
    ]
