"""build_benchmark_report on the real tiny trained home: what the report holds, figures that
are measured (positive, finite, consistent with each other), reuse, that nothing but its
inputs decides it (not what production serves), the max_seconds budget, and `aieng bundle
build`, which composes the report and the bundle."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aieng_core.benchmark.benchmark_report import (
    CODE_VERSION,
    KIND,
    LATENCY_PLOT,
    REPORT_FILE,
    REPORT_FILES,
    THROUGHPUT_PLOT,
    build_benchmark_report,
    dataset_of,
    read_report,
    report_config_sha256,
    report_spec,
)
from aieng_core.benchmark.summary import summary_metrics
from aieng_core.bundle.serving_bundle import GOLDEN_FILE
from aieng_core.cli import main
from aieng_core.config import AiengConfig
from aieng_core.deploy.deployments import Deployments
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.model.memory import GIB, memory_budget
from aieng_core.store import Artifact, ArtifactStore
from tests.bundle_fixtures import BundledHome, craft_model

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOP_LEVEL_KEYS = {
    "model_checkpoint_id",
    "model_partial",
    "parameters",
    "environment",
    "settings",
    "quality",
    "golden",
    "throughput",
    "latency",
    "latency_definitions",
    "memory",
    "truncated",
    "truncated_reason",
    "skipped",
    "seconds",
}
FIGURE_KEYS = {"requests", "tokens", "tokens_per_second", "min_tokens_per_second", "max_tokens_per_second", "runs"}
DISTRIBUTION_KEYS = {"mean", "p50", "p90", "p99"}
EVERY_MEASUREMENT = [
    "validation loss",
    "golden continuations",
    "throughput at batch 1",
    "throughput at batch 4",
    "latency at concurrency 1",
    "latency at concurrency 4",
]


def with_benchmark(config: AiengConfig, **changes: Any) -> AiengConfig:
    return config.model_copy(update={"benchmark": config.benchmark.model_copy(update=changes)})


def positive(value: Any) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def assert_figure(figure: dict[str, Any], requests: int, new_tokens: int) -> None:
    assert set(figure) == FIGURE_KEYS
    assert (figure["requests"], figure["tokens"]) == (requests, requests * new_tokens)
    assert len(figure["runs"]) == 3 and all(positive(rate) for rate in figure["runs"])
    assert figure["tokens_per_second"] == statistics.median(figure["runs"])
    assert figure["min_tokens_per_second"] == min(figure["runs"])
    assert figure["max_tokens_per_second"] == max(figure["runs"])


class Clock:
    """A deadline clock the test moves: reads `now`, then adds `step` after each read."""

    def __init__(self, step: float = 0.0) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        value = self.now
        self.now += self.step
        return value


@pytest.fixture
def home_copy(serving_bundle_artifact: BundledHome, copy_bundled_home) -> ArtifactStore:
    """A copy of the bundled home: the tiny model, its report and bundle current, nothing deployed."""
    return copy_bundled_home(serving_bundle_artifact)


@pytest.fixture
def report(benchmark_report_artifact: Artifact) -> dict[str, Any]:
    return read_report(benchmark_report_artifact)


# ---- the session's report of the tiny model ----------------------------------------------------


def test_the_artifact_holds_the_report_and_two_plots(benchmark_report_artifact: Artifact, trained_home) -> None:
    artifact = benchmark_report_artifact
    assert sorted(p.name for p in artifact.path.iterdir()) == sorted([*REPORT_FILES, "manifest.json"])
    manifest = artifact.manifest
    assert (manifest["kind"], manifest["code_version"]) == (KIND, CODE_VERSION)
    dataset = dataset_of(trained_home.store, trained_home.model)
    assert manifest["inputs"] == [
        {"kind": "model_checkpoint", "id": trained_home.model.id},
        {"kind": "dataset_manifest", "id": dataset.id},
    ]
    assert manifest["config_sha256"] == report_config_sha256(trained_home.config)
    assert artifact.id == report_spec(trained_home.config, trained_home.model, dataset).artifact_id()
    assert artifact.content_sha256 == sha256_json({name: sha256_file(artifact.file(name)) for name in REPORT_FILES})
    for plot in (THROUGHPUT_PLOT, LATENCY_PLOT):
        assert artifact.file(plot).read_bytes().startswith(PNG_MAGIC), plot
    assert artifact.metrics == summary_metrics(read_report(artifact))


def test_report_structure_and_settings(report: dict[str, Any], trained_home) -> None:
    assert set(report) == TOP_LEVEL_KEYS
    assert report["model_checkpoint_id"] == trained_home.model.id
    assert (report["model_partial"], report["parameters"]) == (False, trained_home.model.metrics["parameters"])
    assert report["settings"] == {
        "batch_sizes": [1, 4],
        "prompt_tokens": 8,
        "new_tokens": 8,
        "concurrencies": [1, 4],
        "requests_per_level": 8,
        "compare_transformers": True,
        "max_seconds": 60.0,
        "threads": 0,
        "repeats": 3,
        "warmup_new_tokens": 2,
        "engine_limits": {"max_batch": 4, "max_context": 64, "max_waiting": 4, "max_prefill_tokens": 512},
    }
    environment = report["environment"]
    assert environment["device"] == "cpu" and environment["threads"] >= 1
    assert environment["transformers"] is not None
    assert (report["truncated"], report["truncated_reason"], report["skipped"]) == (False, None, [])
    # Seconds on configs/tiny.yaml, well inside its max_seconds.
    assert 0 < report["seconds"] < report["settings"]["max_seconds"]


def test_quality_is_measured_again_and_agrees_with_training(report: dict[str, Any], trained_home) -> None:
    quality, recorded = report["quality"], trained_home.model.metrics
    assert set(quality) == {
        "validation_loss",
        "validation_perplexity",
        "unigram_baseline_loss",
        "unigram_baseline_perplexity",
        "perplexity_vs_unigram",
        "beats_unigram",
        "block_size",
        "windows",
        "tokens_scored",
        "recorded_validation_loss",
        "recorded_unigram_baseline_loss",
    }
    # The windows training evaluated: eval_batches x batch_size (2 x 16) windows of block_size (32).
    assert (quality["block_size"], quality["windows"], quality["tokens_scored"]) == (32, 32, 32 * 32)
    assert quality["recorded_validation_loss"] == recorded["validation_loss"]
    assert quality["recorded_unigram_baseline_loss"] == recorded["unigram_baseline_loss"]
    # Same windows and weights on CPU: the stored weights reproduce the loss training recorded.
    assert quality["validation_loss"] == pytest.approx(recorded["validation_loss"], rel=1e-6)
    assert quality["unigram_baseline_loss"] == recorded["unigram_baseline_loss"]  # the same counts, exactly
    assert quality["validation_perplexity"] == math.exp(quality["validation_loss"])
    assert quality["unigram_baseline_perplexity"] == math.exp(quality["unigram_baseline_loss"])
    assert quality["perplexity_vs_unigram"] == math.exp(quality["validation_loss"] - quality["unigram_baseline_loss"])
    assert quality["beats_unigram"] is (quality["validation_loss"] < quality["unigram_baseline_loss"]) is True


def test_golden_continuations_are_the_bundles(report: dict[str, Any], serving_bundle_artifact: BundledHome) -> None:
    """Greedy through the same engine on CPU: the report's goldens are those the bundle recorded."""
    golden = json.loads(serving_bundle_artifact.bundle.file(GOLDEN_FILE).read_text(encoding="utf-8"))
    assert [g["prompt"] for g in report["golden"]] == ["The data pipeline", "数据清洗", "A model"]
    # The report has the prompts; the bundle also its golden conversations, after them.
    assert report["golden"] == [g for g in golden["outputs"] if "messages" not in g]


@pytest.fixture(scope="module")
def greedy_agreement(trained_home, benchmark_report_artifact: Artifact) -> dict[int, int]:
    """For each batch size: how many of the report's prompts get the same greedy ids from our
    engine and from transformers `generate`, counted here independently of the report."""
    from aieng_core.benchmark import speed
    from aieng_core.benchmark.benchmark_report import engine_limits
    from aieng_core.model.hf_files import load_model
    from aieng_core.serving.device import torch_threads
    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.tokenizer.bpe import load_tokenizer

    report = read_report(benchmark_report_artifact)
    settings, model_dir = report["settings"], trained_home.model.path
    with torch_threads(report["environment"]["threads"]):
        model = load_model(trained_home.model, "cpu")
        eos = model.config.eos_token_id
        engine = Engine(model, load_tokenizer(model_dir), EngineLimits(**engine_limits(trained_home.config)), eos)
        theirs = speed.transformers_generate(speed.load_transformers_model(model_dir), model.config.pad_token_id)
        agreement = {}
        for size in settings["batch_sizes"]:
            prompts = speed.benchmark_prompts(engine.encode, eos, size, settings["prompt_tokens"])
            ours = speed.engine_generate(engine)(prompts, settings["new_tokens"])
            agreement[size] = speed.matching(ours, theirs(prompts, settings["new_tokens"]))
    return agreement


def test_throughput_side_by_side_with_transformers(report: dict[str, Any], greedy_agreement: dict[int, int]) -> None:
    rows = report["throughput"]
    assert [row["batch_size"] for row in rows] == [1, 4]
    for row in rows:
        size = row["batch_size"]
        assert set(row) == {"batch_size", "ours", "transformers", "ratio_vs_transformers", "matching_outputs"}
        assert_figure(row["ours"], size, 8)
        assert_figure(row["transformers"], size, 8)
        # The ratio is of the two medians measured in the same run.
        assert (
            row["ratio_vs_transformers"] == row["ours"]["tokens_per_second"] / row["transformers"]["tokens_per_second"]
        )
        assert row["matching_outputs"] == greedy_agreement[size]


def test_latency_at_each_concurrency(report: dict[str, Any]) -> None:
    levels = report["latency"]
    assert [level["concurrency"] for level in levels] == [1, 4]
    for level in levels:
        assert (level["requests"], level["completed"], level["output_tokens"]) == (8, 8, 8 * 8)
        assert positive(level["duration_s"]) and positive(level["output_throughput"])
        assert level["output_throughput"] == level["output_tokens"] / level["duration_s"]
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            distribution = level[name]
            assert set(distribution) == DISTRIBUTION_KEYS, name
            assert all(positive(value) for value in distribution.values()), name
            assert distribution["p50"] <= distribution["p90"] <= distribution["p99"], name
        assert level["ttft_ms"]["p50"] < level["e2el_ms"]["p50"]
    assert set(report["latency_definitions"]) == {"ttft", "tpot", "itl", "e2el", "percentiles", "source"}


def test_memory_against_the_budget_rule(report: dict[str, Any]) -> None:
    memory, parameters = report["memory"], report["parameters"]
    assert memory["weights_bytes"] == parameters * 4
    assert memory["budget_bytes"] == int(memory_budget(parameters)["gpu_rule_gib_fp32"] * GIB)
    assert memory["rule"] == "fp32 weights x 1.3 + 2 GiB"
    assert positive(memory["peak_rss_bytes"])
    assert memory["within_budget"] is (memory["peak_rss_bytes"] <= memory["budget_bytes"])


def test_summary_metrics_name_every_figure(benchmark_report_artifact: Artifact, report: dict[str, Any]) -> None:
    metrics = benchmark_report_artifact.metrics
    assert metrics["tokens_per_second_batch_4"] == report["throughput"][1]["ours"]["tokens_per_second"]
    assert metrics["ratio_vs_transformers_batch_1"] == report["throughput"][0]["ratio_vs_transformers"]
    assert metrics["ttft_p99_ms_concurrency_4"] == report["latency"][1]["ttft_ms"]["p99"]
    assert metrics["validation_loss"] == report["quality"]["validation_loss"]
    latency = {
        f"{m}_{p}_ms_concurrency_{c}" for m in ("ttft", "tpot", "itl", "e2el") for p in ("p50", "p99") for c in (1, 4)
    }
    throughput = {
        f"{prefix}_batch_{size}"
        for prefix in ("tokens_per_second", "transformers_tokens_per_second", "ratio_vs_transformers")
        for size in (1, 4)
    }
    assert set(metrics) == {
        "model_checkpoint_id",
        "parameters",
        "threads",
        "seconds",
        "truncated",
        "truncated_reason",
        "validation_loss",
        "validation_perplexity",
        "unigram_baseline_loss",
        "unigram_baseline_perplexity",
        "perplexity_vs_unigram",
        "beats_unigram",
        "peak_rss_bytes",
        "memory_budget_bytes",
        "within_memory_budget",
        *throughput,
        *latency,
    }


# ---- builds in a copy of the home ---------------------------------------------------------------


def test_the_same_recipe_is_reused(home_copy: ArtifactStore, benchmark_report_artifact: Artifact, trained_home) -> None:
    again = build_benchmark_report(home_copy, trained_home.config)
    assert (again.id, again.reused) == (benchmark_report_artifact.id, True)
    assert again.content_sha256 == benchmark_report_artifact.content_sha256  # not measured again
    assert home_copy.list_ids(KIND) == [again.id]
    assert home_copy.require_current(KIND).id == again.id


def test_what_production_serves_decides_nothing_in_the_report(
    home_copy: ArtifactStore, serving_bundle_artifact: BundledHome, tmp_path: Path
) -> None:
    """The report measures one model: its id names every input, and no hidden one (the bundle
    production serves) may decide its bytes, or a reused report would carry a comparison with
    a bundle that no longer serves. Comparing with what serves is the gate's compare step."""
    bundle = serving_bundle_artifact.bundle
    Deployments(home_copy.home).promote(bundle.id, actor="tester", verify=False)
    config = with_benchmark(serving_bundle_artifact.config, batch_sizes=(2,), concurrencies=(1,), requests_per_level=2)
    served = build_benchmark_report(home_copy, config)
    text = served.file(REPORT_FILE).read_text(encoding="utf-8")
    assert bundle.id not in text and "deployed" not in json.loads(text)
    assert not any("deployed" in name for name in served.metrics)
    # The same recipe in a home where nothing is deployed is the same artifact.
    elsewhere = tmp_path / "nothing-deployed"
    shutil.copytree(home_copy.home / "artifacts", elsewhere / "artifacts")
    shutil.copytree(home_copy.home / "refs", elsewhere / "refs")
    assert build_benchmark_report(ArtifactStore(elsewhere), config).id == served.id


def test_without_transformers_our_engine_is_measured_alone(home_copy: ArtifactStore, trained_home) -> None:
    config = with_benchmark(
        trained_home.config, batch_sizes=(2,), concurrencies=(1,), requests_per_level=2, compare_transformers=False
    )
    artifact = build_benchmark_report(home_copy, config)
    report = read_report(artifact)
    [ours] = report["throughput"]
    assert_figure(ours["ours"], 2, 8)
    assert (ours["transformers"], ours["ratio_vs_transformers"], ours["matching_outputs"]) == (None, None, None)
    assert report["environment"]["transformers"] is None
    assert "ratio_vs_transformers_batch_2" not in artifact.metrics


def test_a_tiny_budget_measures_nothing_and_says_so(home_copy: ArtifactStore, trained_home) -> None:
    config = with_benchmark(trained_home.config, max_seconds=1e-6)
    artifact = build_benchmark_report(home_copy, config)
    report = read_report(artifact)
    assert report["truncated"] is True
    assert report["skipped"] == EVERY_MEASUREMENT
    reason = report["truncated_reason"]
    assert reason.startswith("benchmark.max_seconds (1e-06 s) was exceeded after ")
    assert reason.endswith(f" s; not measured: {', '.join(EVERY_MEASUREMENT)}")
    assert (report["quality"], report["golden"], report["throughput"], report["latency"]) == (None, None, [], [])
    assert positive(report["memory"]["peak_rss_bytes"])  # memory is read whatever the budget
    assert artifact.metrics["truncated"] is True and "validation_loss" not in artifact.metrics
    for plot in (THROUGHPUT_PLOT, LATENCY_PLOT):  # a plot saying nothing was measured
        assert artifact.file(plot).read_bytes().startswith(PNG_MAGIC)
    # Published under an id of its own: the complete recipe's id stays free for a complete report.
    spec = report_spec(config, trained_home.model, dataset_of(home_copy, trained_home.model))
    assert artifact.id == replace(spec, recipe={**spec.recipe, "truncated": True}).artifact_id() != spec.artifact_id()
    assert spec.artifact_id() not in home_copy.list_ids(KIND)


def test_the_budget_stops_between_measurements_and_the_next_run_completes(
    home_copy: ArtifactStore, trained_home, benchmark_report_artifact: Artifact
) -> None:
    """The deadline clock reads 0 when the report starts and one second more at each
    measurement asked about: with 3.5 s, the third measurement is the last to start."""
    config = with_benchmark(trained_home.config, max_seconds=3.5)
    truncated = build_benchmark_report(home_copy, config, clock=Clock(step=1.0))
    report = read_report(truncated)
    assert report["skipped"] == EVERY_MEASUREMENT[3:]
    assert report["truncated_reason"] == (
        "benchmark.max_seconds (3.5 s) was exceeded after 4.000 s; not measured: throughput at batch 4, "
        "latency at concurrency 1, latency at concurrency 4"
    )
    assert report["quality"] is not None and len(report["golden"]) == 3
    assert [row["batch_size"] for row in report["throughput"]] == [1]
    assert report["latency"] == []

    # Truncated again: the truncated report is reused, never the complete recipe's id.
    assert build_benchmark_report(home_copy, config, clock=Clock(step=1.0)).id == truncated.id
    # Time enough: measured again and published under the complete recipe's id.
    complete = build_benchmark_report(home_copy, config, clock=Clock(step=0.0))
    spec = report_spec(config, trained_home.model, dataset_of(home_copy, trained_home.model))
    assert (complete.id, complete.reused) == (spec.artifact_id(), False)
    assert read_report(complete)["skipped"] == [] and complete.metrics["truncated"] is False
    assert sorted(home_copy.list_ids(KIND)) == sorted([benchmark_report_artifact.id, truncated.id, complete.id])
    assert home_copy.require_current(KIND).id == complete.id


def test_a_benchmark_that_does_not_fit_the_context_is_refused_before_loading(
    home_copy: ArtifactStore, trained_home
) -> None:
    before = home_copy.list_ids(KIND)
    with pytest.raises(ValueError) as refused:
        build_benchmark_report(home_copy, with_benchmark(trained_home.config, prompt_tokens=60))
    assert str(refused.value) == (
        "benchmark.prompt_tokens (60) + benchmark.new_tokens (8) exceeds bundle.max_context (64)"
    )
    assert home_copy.list_ids(KIND) == before


def test_a_damaged_dataset_is_not_measured(home_copy: ArtifactStore, trained_home) -> None:
    """The validation tokens are read from a verified dataset only."""
    from aieng_core.store import DamagedInput

    dataset = dataset_of(home_copy, trained_home.model)
    tokens = dataset.file("validation.bin")
    data = bytearray(tokens.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tokens.write_bytes(bytes(data))
    before = home_copy.list_ids(KIND)
    with pytest.raises(DamagedInput, match=f"{tokens}: sha256 does not match the manifest"):
        build_benchmark_report(home_copy, with_benchmark(trained_home.config, new_tokens=4))
    assert home_copy.list_ids(KIND) == before


def test_without_a_model_the_report_says_so(tmp_path: Path, trained_home) -> None:
    from aieng_core.store import ArtifactNotFound

    with pytest.raises(ArtifactNotFound, match="model_checkpoint has not been materialized"):
        build_benchmark_report(ArtifactStore(tmp_path / "empty"), trained_home.config)


# ---- `aieng bundle build`: the report, then the bundle ---------------------------------------


def bundle_build(store: ArtifactStore, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--home", str(store.home), "bundle", "build", "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_bundle_build_reuses_the_report_and_the_bundle(
    home_copy: ArtifactStore, serving_bundle_artifact: BundledHome, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = bundle_build(home_copy, capsys)
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert (result["reused"], result["benchmark_report"]["reused"]) == (True, True)
    assert result["id"] == serving_bundle_artifact.bundle.id
    bundle = home_copy.get("serving_bundle", result["id"])
    assert bundle.manifest["inputs"][1] == {"kind": KIND, "id": result["benchmark_report"]["id"]}


def test_bundle_build_refuses_a_partial_model_before_measuring(
    home_copy: ArtifactStore, serving_bundle_artifact: BundledHome, capsys: pytest.CaptureFixture[str]
) -> None:
    base = serving_bundle_artifact.model
    craft_model(home_copy, base, "partial", {**base.metrics, "partial": True, "steps": 6, "stopped_by": "max_minutes"})
    before = home_copy.list_ids(KIND)
    code, out, err = bundle_build(home_copy, capsys)
    assert (code, out) == (1, "")
    assert err.startswith("aieng: error: model_checkpoint ") and "is a partial model" in err
    assert home_copy.list_ids(KIND) == before  # nothing was measured
