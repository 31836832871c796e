"""model_checkpoint and its three checks, materialized by Dagster with the whole graph.

The demo days are materialized once as one range run, then re-run (everything reused).
Each check is also shown to fail: crafted model_checkpoint artifacts (NaN weights, a loss
no better than the baseline, more stored parameters than the config implies) are made
current in copies of the home, and the checks are invoked on them.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from safetensors.torch import load_file, save_file

from aieng_core.data.demo_data import land_demo_data
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.model.hf_files import CONFIG_FILE, MODEL_FILE, checkpoint_config
from aieng_core.model.llama import expected_parameters
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced
from aieng_core.training import model_checkpoint as model_core
from orchestration.assets.model import (
    beats_unigram_baseline,
    model_checkpoint,
    parameter_count_matches_config,
    weights_finite,
)
from orchestration.definitions import ALL_CHECKS
from orchestration.resources import AiengResource
from tests.conftest import TINY_CONFIG
from tests.core.fake_clock import StepClock
from tests.orchestration.helpers import (
    ALL_DEMO_DAYS,
    ASSET_DEFS,
    CHECK_NAMES,
    check_outcomes,
    meta,
    resources,
    run_materializations,
)

MODEL_CHECKS = {"weights_finite", "beats_unigram_baseline", "parameter_count_matches_config"}
GRAPH = [*ASSET_DEFS, model_checkpoint, *ALL_CHECKS]
TINY_PARAMETERS = 123_712


@dataclass
class Materialized:
    home: Path
    instance: dg.DagsterInstance
    first: dg.ExecuteInProcessResult
    again: dg.ExecuteInProcessResult

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.home)


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Materialized]:
    """The demo days through model_checkpoint in one range run, then the same run again."""
    home = tmp_path_factory.mktemp("model-graph") / "aieng-home"
    home.mkdir()
    land_demo_data(home)
    with dg.instance_for_test() as instance:
        first = dg.materialize(GRAPH, instance=instance, resources=resources(home), tags=ALL_DEMO_DAYS)
        again = dg.materialize(GRAPH, instance=instance, resources=resources(home), tags=ALL_DEMO_DAYS)
        yield Materialized(home, instance, first, again)


def model_materialization(result: dg.ExecuteInProcessResult) -> dg.AssetMaterialization:
    return run_materializations(result)[("model_checkpoint", None)]


# ---- the run --------------------------------------------------------------------------------


def test_range_run_materializes_the_model_and_every_check_passes(graph: Materialized) -> None:
    for result in (graph.first, graph.again):
        assert result.success
        assert check_outcomes(result) == {name: True for name in CHECK_NAMES | MODEL_CHECKS}
        assert ("model_checkpoint", None) in run_materializations(result)


def test_metadata_carries_the_numeric_metrics(graph: Materialized) -> None:
    values = meta(model_materialization(graph.first))
    artifact = graph.store.require_current("model_checkpoint")
    assert values["artifact_id"] == artifact.id
    assert values["content_sha256"] == artifact.content_sha256
    assert values["reused"] is False
    # Every number the core lists is shown, but resumed_from_step, which is None: this run started from scratch.
    shown = {name for name in model_core.NUMERIC_METRICS if name in values}
    assert shown == set(model_core.NUMERIC_METRICS) - {"resumed_from_step"}
    for name in shown:
        assert isinstance(values[name], (int, float)) and not isinstance(values[name], bool), name
        assert values[name] == artifact.metrics[name], name
    for name in ("train_loss", "validation_loss", "train_perplexity", "validation_perplexity", "unigram_baseline_loss",
                 "tokens_seen", "tokens_per_second", "wall_seconds", "parameters", "weights_bytes_fp32",
                 "weights_bytes_bf16", "weights_bytes_int8", "gpu_rule_gib_fp32"):  # fmt: skip
        assert name in values, name
    assert values["stopped_by"] == "max_steps"
    assert values["partial"] is False
    assert values["training"] == "complete: 150 of 150 steps"
    assert values["steps"] == values["max_steps"] == 150
    assert values["tokens_seen"] == 150 * 16 * 32
    assert values["parameters"] == TINY_PARAMETERS
    assert values["weights_bytes_fp32"] == 4 * TINY_PARAMETERS
    assert values["validation_perplexity"] == pytest.approx(math.exp(values["validation_loss"]), rel=1e-12)
    assert values["validation_loss"] < values["unigram_baseline_loss"]
    # The data version Dagster records is the artifact's content hash.
    assert model_materialization(graph.first).tags["dagster/data_version"] == artifact.content_sha256
    assert artifact.manifest["dagster_run_id"] == graph.first.run_id


def test_loss_curves_are_an_inline_png_of_the_artifact_plot(graph: Materialized) -> None:
    markdown = meta(model_materialization(graph.first))["loss_curves"]
    assert "data:image/png;base64," in markdown
    encoded = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown).group(1)
    png = base64.b64decode(encoded)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert png == graph.store.require_current("model_checkpoint").file(model_core.LOSS_CURVE_FILE).read_bytes()
    metrics = graph.store.require_current("model_checkpoint").metrics
    assert f"**{metrics['validation_loss']:.4f}**" in markdown
    assert f"**{metrics['unigram_baseline_loss']:.4f}**" in markdown


def test_rerun_reuses_the_model(graph: Materialized) -> None:
    first, again = meta(model_materialization(graph.first)), meta(model_materialization(graph.again))
    assert first["reused"] is False and again["reused"] is True
    assert again["artifact_id"] == first["artifact_id"]
    assert again["content_sha256"] == first["content_sha256"]
    numbers = model_core.NUMERIC_METRICS
    assert {name: again.get(name) for name in numbers} == {name: first.get(name) for name in numbers}
    assert graph.store.list_ids("model_checkpoint") == [first["artifact_id"]]
    # The manifest still names the run that trained it.
    assert graph.store.require_current("model_checkpoint").manifest["dagster_run_id"] == graph.first.run_id


def test_a_run_stopped_by_max_minutes_shows_a_partial_model_and_the_next_run_completes_it(
    graph: Materialized, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "aieng-home"
    shutil.copytree(graph.home, home)
    config_path = tmp_path / "ten-steps.yaml"
    config_path.write_text(TINY_CONFIG.read_text(encoding="utf-8").replace("max_steps: 150", "max_steps: 10"))
    aieng = AiengResource(home=str(home), config_path=str(config_path))
    # Each step takes 20 s of a fake clock: max_minutes (2) stops the first run after 6 steps.
    clock = StepClock(seconds_per_step=20.0)
    timed = functools.partial(model_core.build_model_checkpoint, on_step=clock.on_step, clock=clock)
    with dg.instance_for_test() as instance:
        with monkeypatch.context() as patch:
            patch.setattr(model_core, "build_model_checkpoint", timed)
            stopped = dg.materialize([model_checkpoint], instance=instance, resources={"aieng": aieng})
        completed = dg.materialize([model_checkpoint], instance=instance, resources={"aieng": aieng})
    partial, full = meta(model_materialization(stopped)), meta(model_materialization(completed))
    assert (partial["partial"], partial["stopped_by"], partial["steps"], partial["max_steps"]) == (
        True, "max_minutes", 6, 10
    )  # fmt: skip
    assert partial["training"] == (
        "**partial model**: stopped by max_minutes after 6 of 10 steps; materialize again to resume to max_steps"
    )
    assert "resumed_from_step" not in partial
    assert (full["partial"], full["stopped_by"], full["steps"], full["max_steps"]) == (False, "max_steps", 10, 10)
    assert full["training"] == "complete: 10 of 10 steps"
    assert full["resumed_from_step"] == 6
    assert full["artifact_id"] != partial["artifact_id"]
    assert full["content_sha256"] != partial["content_sha256"]
    assert ArtifactStore(home).require_current("model_checkpoint").id == full["artifact_id"]


def test_check_metadata_reports_what_was_checked(graph: Materialized) -> None:
    evaluations = {e.check_name: e for e in graph.first.get_asset_check_evaluations()}
    finite = {k: v.value for k, v in evaluations["weights_finite"].metadata.items()}
    assert finite == {"non_finite_tensors": "none"}
    counts = {k: v.value for k, v in evaluations["parameter_count_matches_config"].metadata.items()}
    assert counts == {"stored": TINY_PARAMETERS, "expected_from_config": TINY_PARAMETERS}
    losses = {k: v.value for k, v in evaluations["beats_unigram_baseline"].metadata.items()}
    metrics = graph.store.require_current("model_checkpoint").metrics
    assert losses == {
        "validation_loss": metrics["validation_loss"],
        "unigram_baseline_loss": metrics["unigram_baseline_loss"],
    }


# ---- each check can fail --------------------------------------------------------------------


def craft_current(
    store: ArtifactStore,
    base: Artifact,
    name: str,
    tensors: dict | None = None,
    config: dict | None = None,
    metrics: dict[str, Any] | None = None,
) -> Artifact:
    """A model_checkpoint artifact made from `base` with changed weights, config or metrics,
    written through the store (so its manifest hashes match its files) and made current."""

    def produce(staging: Path) -> Produced:
        for path in base.path.iterdir():
            if path.name != "manifest.json":
                shutil.copyfile(path, staging / path.name)
        if tensors is not None:
            save_file(tensors, staging / MODEL_FILE, metadata={"format": "pt"})
        if config is not None:
            (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        content = {p.name: sha256_file(p) for p in sorted(staging.iterdir())}
        return Produced(content_sha256=sha256_json(content), metrics=metrics if metrics is not None else base.metrics)

    spec = ArtifactSpec(kind=base.kind, code_version=f"crafted-{name}", config_sha256=base.manifest["config_sha256"])
    artifact = store.build(spec, produce)
    assert store.require_current(base.kind).id == artifact.id != base.id
    assert store.verify(artifact) == []
    return artifact


@pytest.fixture
def copied(graph: Materialized, tmp_path: Path) -> tuple[ArtifactStore, AiengResource, Artifact]:
    home = tmp_path / "aieng-home"
    shutil.copytree(graph.home, home)
    store = ArtifactStore(home)
    return store, AiengResource(home=str(home), config_path=str(TINY_CONFIG)), store.require_current("model_checkpoint")


def check_metadata(result: dg.AssetCheckResult) -> dict[str, Any]:
    return {key: value.value for key, value in result.metadata.items()}


def test_checks_pass_on_the_trained_model(copied) -> None:
    _, aieng, _ = copied
    for check in (weights_finite, beats_unigram_baseline, parameter_count_matches_config):
        assert check(aieng=aieng).passed is True, check.__name__


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_finite_fails_on_a_non_finite_weight(copied, value: float) -> None:
    store, aieng, base = copied
    tensors = load_file(base.file(MODEL_FILE))
    tensors["model.layers.0.self_attn.q_proj.weight"][1, 2] = value
    craft_current(store, base, f"non-finite-{value}", tensors=tensors)
    result = weights_finite(aieng=aieng)
    assert result.passed is False
    assert check_metadata(result) == {"non_finite_tensors": "model.layers.0.self_attn.q_proj.weight"}
    # The other checks are unaffected by one bad value.
    assert parameter_count_matches_config(aieng=aieng).passed is True


@pytest.mark.parametrize("margin", [0.0, 0.5])
def test_beats_unigram_baseline_fails_when_the_model_does_not_beat_it(copied, margin: float) -> None:
    store, aieng, base = copied
    baseline = base.metrics["unigram_baseline_loss"]
    craft_current(store, base, f"no-better-{margin}", metrics={**base.metrics, "validation_loss": baseline + margin})
    result = beats_unigram_baseline(aieng=aieng)
    assert result.passed is False
    assert check_metadata(result) == {"validation_loss": baseline + margin, "unigram_baseline_loss": baseline}


def test_parameter_count_fails_on_extra_stored_weights(copied) -> None:
    store, aieng, base = copied
    tensors = load_file(base.file(MODEL_FILE))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # untied head on a tied config
    craft_current(store, base, "extra-head", tensors=tensors)
    result = parameter_count_matches_config(aieng=aieng)
    assert result.passed is False
    assert check_metadata(result) == {"stored": TINY_PARAMETERS + 512 * 64, "expected_from_config": TINY_PARAMETERS}


def test_parameter_count_fails_when_the_config_disagrees_with_the_weights(copied) -> None:
    store, aieng, base = copied
    config = json.loads(base.file(CONFIG_FILE).read_text())
    config["num_hidden_layers"] = 3
    crafted = craft_current(store, base, "three-layers", config=config)
    expected = expected_parameters(checkpoint_config(crafted))
    assert expected == TINY_PARAMETERS + 45_440
    result = parameter_count_matches_config(aieng=aieng)
    assert result.passed is False
    assert check_metadata(result) == {"stored": TINY_PARAMETERS, "expected_from_config": expected}


def test_checks_run_in_dagster_fail_on_a_nan_checkpoint(copied) -> None:
    """The checks alone, in a Dagster run against a NaN checkpoint made current: the
    blocking weights check fails and the run reports it."""
    store, aieng, base = copied
    tensors = load_file(base.file(MODEL_FILE))
    tensors["model.norm.weight"][0] = float("nan")
    craft_current(store, base, "nan-norm", tensors=tensors)
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [model_checkpoint, weights_finite, beats_unigram_baseline, parameter_count_matches_config],
            instance=instance,
            resources={"aieng": aieng},
            selection=dg.AssetSelection.checks_for_assets(model_checkpoint),
            raise_on_error=False,
        )
    outcomes = check_outcomes(result)
    assert outcomes == {"weights_finite": False, "beats_unigram_baseline": True, "parameter_count_matches_config": True}
    assert run_materializations(result) == {}


# ---- what the asset page shows first ----------------------------------------------------------


def validation_text_ratio(store: ArtifactStore, model: Artifact, limit: int | None = None) -> float:
    """Tokens per byte of the validation stream, counted here from the files: every token of
    the stream (or of its whole documents within the first `limit` tokens) against the UTF-8
    bytes of each document decoded on its own."""
    import numpy as np

    from aieng_core.tokenizer.bpe import load_tokenizer
    from aieng_core.training.corpus import open_token_streams

    dataset_id = next(item["id"] for item in model.manifest["inputs"] if item["kind"] == "dataset_manifest")
    _, validation = open_token_streams(store.get("dataset_manifest", dataset_id))
    tokens = validation[0 : len(validation)]
    eos = json.loads((model.path / CONFIG_FILE).read_text())["eos_token_id"]
    ends = np.flatnonzero(tokens == eos)
    if limit is not None:
        ends = ends[ends < limit]
        tokens = tokens[: int(ends[-1]) + 1]
    tokenizer = load_tokenizer(model.path)
    documents, begin = [], 0
    for end in ends.tolist():
        documents.append(tokenizer.decode(tokens[begin:end].tolist()))
        begin = end + 1
    return len(tokens) / sum(len(text.encode("utf-8")) for text in documents)


def test_quality_comes_first_in_nats_and_in_bits_per_byte(graph: Materialized) -> None:
    values = meta(model_materialization(graph.first))
    artifact = graph.store.require_current("model_checkpoint")
    assert list(values)[:5] == [
        "validation_loss",
        "validation_bits_per_byte",
        "unigram_baseline_loss",
        "unigram_baseline_bits_per_byte",
        "training",
    ]
    ratio = validation_text_ratio(graph.store, artifact)
    for name in ("validation", "unigram_baseline"):
        assert values[f"{name}_bits_per_byte"] == pytest.approx(
            artifact.metrics[f"{name}_loss"] / math.log(2) * ratio, rel=1e-9
        ), name
    # A byte of this text is about two tokens of a 512-token vocabulary: bits per byte is about
    # half the bits per token, and the model beats frequencies in this unit too.
    assert 1.0 < values["validation_bits_per_byte"] < values["unigram_baseline_bits_per_byte"] < 6.0
    assert values["validation_bits_per_byte"] < values["validation_loss"] / math.log(2)


def test_a_long_stream_is_sampled_in_whole_documents(graph: Materialized, monkeypatch: pytest.MonkeyPatch) -> None:
    from aieng_core.training import bits_per_byte

    artifact = graph.store.require_current("model_checkpoint")
    monkeypatch.setattr(bits_per_byte, "SAMPLE_TOKENS", 3000)
    sampled = bits_per_byte.tokens_per_byte(artifact, graph.store)
    assert sampled == pytest.approx(validation_text_ratio(graph.store, artifact, limit=3000), rel=1e-12)
    assert sampled != validation_text_ratio(graph.store, artifact)  # a sample, not the whole stream
