"""Smoke test of `aieng bench model`: the tiny config from $AIENG_CONFIG, two rounds of a few steps.

The figures themselves are not judged here (a test machine's load decides them); how they
were taken is: each side in a fresh process of its own, the order alternated, the summary
computed from the rounds, both sides training the same weights on the same batches.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from aieng_core import cli
from aieng_core.bench.model_bench import TRAINING_GOAL, run_model_bench
from tests.conftest import TINY_CONFIG

pytestmark = pytest.mark.e2e  # starts fresh Python processes


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "model.json"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("AIENG_CONFIG", str(TINY_CONFIG))
        returned = run_model_bench(steps=2, rounds=2, warmup=1, out=str(out))
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned))
    return written


def test_config_comes_from_aieng_config(results: dict) -> None:
    assert results["config_file"] == str(TINY_CONFIG.resolve())
    config = results["model"]["config"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (64, 2, 512)


def test_each_side_ran_in_its_own_fresh_process(results: dict) -> None:
    pids = [record[side]["pid"] for record in results["training"]["rounds"] for side in ("ours", "transformers")]
    assert len(set(pids)) == len(pids) == 4
    assert os.getpid() not in pids


def test_rounds_alternate_the_order(results: dict) -> None:
    rounds = results["training"]["rounds"]
    assert [record["round"] for record in rounds] == [0, 1]
    assert [record["order"] for record in rounds] == [["ours", "transformers"], ["transformers", "ours"]]


def test_summary_is_computed_from_the_rounds(results: dict) -> None:
    training = results["training"]
    assert training["steps_measured"] == 2 and training["warmup_steps"] == 1
    assert training["tokens_per_step"] == 16 * 32
    for side in ("ours", "transformers"):
        rates = [record[side]["tokens_per_second"] for record in training["rounds"]]
        assert all(record[side]["steps_measured"] == 2 for record in training["rounds"])
        assert all(record[side]["load_average_1min_before"] >= 0 for record in training["rounds"])
        summary = training[side]
        assert summary["tokens_per_second"] == rates
        assert summary["median_tokens_per_second"] == statistics.median(rates) > 0
        assert summary["min_tokens_per_second"] == min(rates)
        assert summary["max_tokens_per_second"] == max(rates)
    ratio = training["ours"]["median_tokens_per_second"] / training["transformers"]["median_tokens_per_second"]
    assert training["ratio_of_medians"] == pytest.approx(ratio)
    goal = results["goals"]["training_tokens_per_second_vs_transformers"]
    assert goal == {"value": round(ratio, 3), "goal": f">= {TRAINING_GOAL}", "met": ratio >= TRAINING_GOAL}


def test_both_sides_train_the_same_weights_on_the_same_batches(results: dict) -> None:
    # Same initial weights, same batches, same loop: the losses agree to float rounding,
    # before and after the optimizer has moved the weights.
    for record in results["training"]["rounds"]:
        assert record["ours"]["first_loss"] == pytest.approx(record["transformers"]["first_loss"], abs=1e-4)
        assert record["ours"]["last_loss"] == pytest.approx(record["transformers"]["last_loss"], abs=1e-3)
    first = results["training"]["rounds"][0]["ours"]
    assert first["last_loss"] != first["first_loss"]  # the weights really moved


def test_loading_comparison_is_kept(results: dict) -> None:
    loading = results["loading"]
    assert loading["weights_bytes"] > 0
    assert loading["ours_safetensors_verified_seconds"] > 0 and loading["torch_load_pt_seconds"] > 0


def test_cli_passes_rounds_and_steps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = {}

    def fake_bench(**kwargs) -> dict:
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("aieng_core.bench.model_bench.run_model_bench", fake_bench)
    with pytest.raises(SystemExit):
        cli.main(["bench", "model", "--rounds", "5", "--steps", "7", "--out", str(tmp_path / "m.json")])
    assert seen == {"steps": 7, "rounds": 5, "out": str(tmp_path / "m.json"), "config": None}
