"""`aieng bench serving`: the metric definitions exactly, and a quick run's report.

The quick run (tiny config, one round, a few tokens) is a smoke test of how the figures are
taken, not of their values (a test machine's load decides those): every peer in a fresh
process of its own, the same work for every peer (equal token counts), a real server over
HTTP, every figure a positive number, every goal computed from the medians it names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from aieng_core import cli
from aieng_core.bench.serving_bench import GOALS, run_serving_bench
from aieng_core.loadgen.stats import METRIC_DEFINITIONS, RequestRecord, percentile, summarize
from tests.conftest import TINY_CONFIG


# ---- metric definitions (no processes) ----------------------------------------------------------
@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], [0.1 * i * i for i in range(37)]])
@pytest.mark.parametrize("q", [0, 50, 90, 99, 100])
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def _record(sent: float, chunks: list[float], done: float, tokens: int, prompt: int = 5) -> RequestRecord:
    return RequestRecord(prompt_tokens=prompt, output_tokens=tokens, sent=sent, chunk_times=chunks, done=done, ok=True)


def test_ttft_tpot_itl_e2el_follow_vllm_definitions() -> None:
    record = _record(sent=10.0, chunks=[10.2, 10.3, 10.5, 10.6], done=10.6, tokens=4)
    assert record.ttft == pytest.approx(0.2)
    assert record.e2el == pytest.approx(0.6)
    assert record.tpot == pytest.approx((0.6 - 0.2) / 3)  # (E2EL - TTFT) / (output tokens - 1)
    assert record.itls == pytest.approx([0.1, 0.2, 0.1])
    assert _record(0.0, [0.1], 0.1, tokens=1).tpot is None  # one token: no time *per further* token


def test_summary_throughput_and_goodput() -> None:
    fast = _record(sent=0.0, chunks=[0.1, 0.2, 0.3], done=0.3, tokens=3, prompt=4)
    slow_first_token = _record(sent=0.5, chunks=[1.5, 1.6, 1.7], done=1.7, tokens=3, prompt=6)
    failed = RequestRecord(prompt_tokens=9, output_tokens=8, sent=0.2, done=0.4, error="HTTP 500")
    summary = summarize([fast, slow_first_token, failed], {"ttft": 500.0, "tpot": 150.0})
    assert (summary["requests"], summary["completed"], summary["failed"]) == (3, 2, 1)
    assert summary["duration_s"] == pytest.approx(1.7)  # first sent -> last finished
    assert summary["output_tokens"] == 6 and summary["prompt_tokens"] == 10
    assert summary["request_throughput"] == pytest.approx(2 / 1.7)
    assert summary["output_throughput"] == pytest.approx(6 / 1.7)
    assert summary["total_token_throughput"] == pytest.approx(16 / 1.7)
    assert summary["good_requests"] == 1  # the slow one missed the TTFT SLO
    assert summary["goodput"] == pytest.approx(1 / 1.7)
    assert summary["ttft_ms"]["p50"] == pytest.approx(550.0)
    assert summary["itl_ms"]["mean"] == pytest.approx(100.0)
    assert summary["errors"] == ["HTTP 500"]


def test_summary_refuses_a_run_where_nothing_completed() -> None:
    with pytest.raises(ValueError, match="no request of 1 completed"):
        summarize([RequestRecord(prompt_tokens=1, output_tokens=1, sent=0.0, error="boom")], {})


# ---- a quick run, end to end --------------------------------------------------------------------
@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "serving.json"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("AIENG_CONFIG", str(TINY_CONFIG))
        returned = run_serving_bench(out=str(out), quick=True)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned))
    return written


PEERS = ("ours", "transformers", "ctranslate2", "http")


@pytest.mark.e2e
def test_each_peer_ran_in_its_own_fresh_process(results: dict) -> None:
    (record,) = results["rounds"]
    assert record["order"] == list(PEERS)
    pids = [record[peer]["pid"] for peer in PEERS]
    pids += [
        record["http"]["server_pid"],
        results["profile"]["pid"],
        results["method"]["ctranslate2_conversion"]["pid"],
    ]
    assert len(set(pids)) == len(pids)
    assert os.getpid() not in pids
    assert record["http"]["server_exit_code"] == 0  # SIGTERM: drained and exited cleanly
    threads = results["machine"]["threads"]
    assert all(record[peer]["threads"] == threads for peer in ("ours", "transformers", "ctranslate2"))
    assert all(record[peer]["load_average_1min"] >= 0 for peer in PEERS)


@pytest.mark.e2e
def test_every_peer_did_the_same_work(results: dict) -> None:
    figures = results["figures"]
    new = figures["single_stream"]["new_tokens_per_request"]
    single = figures["single_stream"]
    assert {single[p]["tokens"] for p in ("ours", "transformers", "ctranslate2")} == {
        new * len(single["prompt_tokens"])
    }
    for size in ("16", "64"):
        batch = figures["batch_vs_ctranslate2"][size]
        assert len(batch["prompt_tokens"]) == int(size)
        assert {batch[p]["tokens"] for p in ("ours", "transformers", "ctranslate2")} == {new * int(size)}
    http = figures["http_16_clients_mixed"]
    assert len(http["max_new_tokens"]) == 16 and len(set(http["max_new_tokens"])) > 1
    assert len(set(http["prompt_tokens"])) > 1  # mixed lengths
    peers = (
        "ours_http",
        "ours_in_process",
        "transformers_sequential",
        "transformers_static_batch",
        "ctranslate2_batch",
    )
    assert {http[p]["tokens"] for p in peers} == {sum(http["max_new_tokens"])}
    # Static batching computes the longest request's length for every row; only asked-for tokens count.
    assert http["transformers_static_batch"]["tokens_computed"] == 16 * max(http["max_new_tokens"])


def _spreads(tree: object) -> list[dict]:
    if isinstance(tree, dict):
        if {"median", "min", "max", "rounds"} <= tree.keys():
            return [tree]
        return [found for value in tree.values() for found in _spreads(value)]
    return []


@pytest.mark.e2e
def test_every_figure_is_a_positive_number_with_its_spread(results: dict) -> None:
    figures = results["figures"]
    throughput = [
        figures["single_stream"],
        *(figures["batch_vs_ctranslate2"][size] for size in ("1", "16", "64")),
        figures["http_16_clients_mixed"],
        figures["flops_at_batch_64"],
    ]
    spreads = [s for figure in throughput for s in _spreads(figure)]
    assert len(spreads) >= 20
    for figure in spreads:
        assert len(figure["rounds"]) == 1
        assert figure["min"] <= figure["median"] <= figure["max"]
        assert figure["min"] > 0, figure


@pytest.mark.e2e
def test_serving_metrics_use_the_fields_names(results: dict) -> None:
    metrics = results["figures"]["serving_metrics"]
    assert metrics["definitions"] == METRIC_DEFINITIONS
    assert set(metrics["slo_ms"]) == {"ttft", "tpot"}
    assert set(metrics["concurrency"]) == {"1", "4", "16", "64"}
    assert len(metrics["poisson_rate"]) >= 1
    for run in [*metrics["concurrency"].values(), *metrics["poisson_rate"].values()]:
        assert run["failed"]["median"] == 0 and run["completed"]["median"] == run["requests"]["median"]
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            assert set(run[name]) == {"mean", "p50", "p90", "p99"}
            assert 0 < run[name]["p50"]["median"] <= run[name]["p99"]["median"]
        assert run["e2el_ms"]["p50"]["median"] >= run["ttft_ms"]["p50"]["median"]
        for name in ("request_throughput", "output_throughput", "duration_s"):
            assert run[name]["median"] > 0
        assert 0 <= run["goodput"]["median"] <= run["request_throughput"]["median"]


@pytest.mark.e2e
def test_goals_are_ratios_of_the_medians(results: dict) -> None:
    figures, goals = results["figures"], results["goals"]
    assert set(goals) == set(GOALS)
    single, http = figures["single_stream"], figures["http_16_clients_mixed"]
    expected = {
        "single_stream_vs_transformers": single["ours"]["median"] / single["transformers"]["median"],
        "http_16_clients_vs_transformers_static_batch": http["ours_http"]["median"]
        / http["transformers_static_batch"]["median"],
        "flops_fraction_of_matmul_peak_at_batch_64": figures["flops_at_batch_64"]["fraction_of_peak"]["median"],
    }
    for size in ("1", "16", "64"):
        batch = figures["batch_vs_ctranslate2"][size]
        expected[f"batch_{size}_vs_ctranslate2"] = batch["ours"]["median"] / batch["ctranslate2"]["median"]
    for name, ratio in expected.items():
        assert goals[name]["ratio"] == pytest.approx(ratio)
    for name, goal in goals.items():
        assert goal["target"] == GOALS[name]
        assert goal["met"] == (goal["ratio"] >= goal["target"])
    flops = figures["flops_at_batch_64"]
    assert flops["fraction_of_peak"]["median"] == pytest.approx(
        flops["achieved_gflops"]["median"] / flops["matmul_peak_gflops"]["median"]
    )


@pytest.mark.e2e
def test_bounds_and_profile_are_reported(results: dict) -> None:
    assert isinstance(results["bounds"], list) and all(isinstance(note, str) for note in results["bounds"])
    for size in ("1", "64"):
        step = results["profile"]["batches"][size]
        assert step["decode_steps"] > 0
        parts = step["forward_ms"] + step["sampling_ms"] + step["scheduler_and_python_ms"]
        assert parts == pytest.approx(step["step_ms"], rel=1e-6)
    machine = results["machine"]
    assert machine["cpus"] >= 1 and machine["threads"] == 1  # quick: one thread (speed is not judged)
    assert len(machine["load_average_at_start"]) == 3


def test_cli_runs_the_serving_suite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = {}

    def fake_bench(**kwargs) -> dict:
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("aieng_core.bench.serving_bench.run_serving_bench", fake_bench)
    with pytest.raises(SystemExit):
        cli.main(["bench", "serving", "--quick", "--out", str(tmp_path / "s.json")])
    assert seen["quick"] is True and seen["out"] == str(tmp_path / "s.json")
