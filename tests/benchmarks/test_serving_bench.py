"""`aieng bench serving`: the metric definitions exactly, the rounds and their report on fake
workers exactly, and a quick run's report.

The fake workers (no processes) answer with numbers chosen so that the median of the rounds,
their mean and the first round all differ: the peers' order alternating from round to round,
every figure's median and min..max spread, and every goal as a ratio of medians are checked
to the exact number. The quick run (tiny config, one round, a few tokens) is a smoke test of
how the figures are taken, not of their values (a test machine's load decides those): every
peer in a fresh process of its own, the same work for every peer (equal token counts), a real
server over HTTP, every figure a positive number, every goal computed from the medians it names;
the contention workload's workers likewise (its exact report: test_serving_contention.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from aieng_core import cli
from aieng_core.bench import serving_bench
from aieng_core.bench.serving_bench import GOALS, run_serving_bench
from aieng_core.bench.serving_plan import CONTENTION_PEERS
from aieng_core.bench.serving_report import AT_MOST_GOALS, peer_figure, spread, spread_tree
from aieng_core.bench.serving_rounds import peer_order, run_rounds
from aieng_core.loadgen.stats import METRIC_DEFINITIONS, RequestRecord, percentile, summarize
from tests.benchmarks.test_serving_contention import FAKE_CONTENTION_PLAN, fake_contention_worker
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


# ---- rounds and their report on fake workers (no processes) -------------------------------------
PEERS = ("ours", "transformers", "ctranslate2", "ours_int8", "ctranslate2_int8", "http")


def test_the_peer_order_alternates_from_round_to_round() -> None:
    calls: list[str] = []

    def run(peer: str) -> dict:
        calls.append(peer)
        return {"call": len(calls)}

    records = run_rounds(PEERS, 3, run)

    forward, backward = list(PEERS), list(reversed(PEERS))
    assert calls == forward + backward + forward
    assert [record["order"] for record in records] == [forward, backward, forward]
    assert [record["round"] for record in records] == [0, 1, 2]
    # Each record holds what its own run returned: round 1 ran http first (call 7), ours last (call 12).
    assert [records[1][peer]["call"] for peer in PEERS] == [12, 11, 10, 9, 8, 7]
    assert [peer_order(PEERS, index)[0] for index in range(4)] == ["ours", "http", "ours", "http"]


def test_a_spread_is_the_exact_median_and_min_max_of_the_rounds() -> None:
    assert spread([4.0, 1.0, 2.5]) == {"median": 2.5, "min": 1.0, "max": 4.0, "rounds": [4.0, 1.0, 2.5]}
    assert spread([4.0, 1.0, 2.0, 9.0]) == {"median": 3.0, "min": 1.0, "max": 9.0, "rounds": [4.0, 1.0, 2.0, 9.0]}
    assert spread([7.0]) == {"median": 7.0, "min": 7.0, "max": 7.0, "rounds": [7.0]}


def test_a_tree_of_rounds_spreads_its_numbers_and_keeps_the_rest_from_round_0() -> None:
    rounds = [
        {"c": {"1": {"ttft_ms": {"p50": 9.0}, "requests": 8, "errors": ["e0"], "ok": True, "note": "a", "x": None}}},
        {"c": {"1": {"ttft_ms": {"p50": 1.0}, "requests": 8, "errors": [], "ok": False, "note": "b", "x": 1}}},
        {"c": {"1": {"ttft_ms": {"p50": 3.0}, "requests": 8, "errors": [], "ok": False, "note": "c", "x": 2}}},
    ]
    assert spread_tree(rounds) == {
        "c": {
            "1": {
                "ttft_ms": {"p50": {"median": 3.0, "min": 1.0, "max": 9.0, "rounds": [9.0, 1.0, 3.0]}},
                "requests": {"median": 8.0, "min": 8.0, "max": 8.0, "rounds": [8.0, 8.0, 8.0]},
                "errors": ["e0"],
                "ok": True,
                "note": "a",
                "x": None,
            }
        }
    }


def test_a_peer_whose_token_counts_differ_between_rounds_is_refused() -> None:
    rounds = [{"ours": {"workloads": {"w": {"tokens_per_second": 1.0, "tokens": n}}}} for n in (8, 8, 9)]
    with pytest.raises(RuntimeError, match="ours w: token counts differ between rounds"):
        peer_figure(rounds, "ours", "w")


# Per round, each peer runs at BASE x its factor of that round (x the workload's SCALE). The
# factors' median (2) is neither their mean nor round 0's, and differs in which round holds it.
FACTORS = {
    "ours": (4.0, 1.0, 2.0),
    "transformers": (1.0, 2.0, 8.0),
    "ctranslate2": (2.0, 8.0, 1.0),
    "http": (1.0, 4.0, 2.0),
    "ours_int8": (2.0, 1.0, 8.0),
    "ctranslate2_int8": (1.0, 8.0, 2.0),
}
BASE = {"ours": 100.0, "transformers": 20.0, "ctranslate2": 50.0, "http": 40.0, "ours_int8": 75.0}
BASE["ctranslate2_int8"] = 60.0
SCALE = {"single_stream": 1.0, "batch_16": 8.0, "batch_64": 32.0, "mixed_batch": 4.0, "mixed_sequential": 1.0}
SCALE["mixed_static_batch"] = 2.0
TOKENS = {"single_stream": 8, "batch_16": 64, "batch_64": 256, "mixed_batch": 8, "mixed_sequential": 8}
TOKENS["mixed_static_batch"] = 8
WORKLOADS = {
    "ours": ("single_stream", "batch_16", "batch_64", "mixed_batch"),
    "transformers": ("single_stream", "batch_16", "batch_64", "mixed_sequential", "mixed_static_batch"),
    "ctranslate2": ("single_stream", "batch_16", "batch_64", "mixed_batch"),
    "ours_int8": ("single_stream", "batch_16", "batch_64"),
    "ctranslate2_int8": ("single_stream", "batch_16", "batch_64"),
}
FAKE_PLAN = {
    "single_stream_prompts": [[5, 6, 7], [8, 9]],
    "new_tokens": 4,
    "batch_prompts": {"16": [[5, 6]] * 16, "64": [[5]] * 64},
    "mixed": [{"ids": [5, 6], "max_new_tokens": 3}, {"ids": [7], "max_new_tokens": 5}],
    "sweep_requests": [{"ids": [5], "max_new_tokens": 2}],
    "model_config": {"num_attention_heads": 4, "head_dim": 16, "num_hidden_layers": 2},
    "parameters": 1000,
    "matmul_sizes": [64],
    "server_env": {},
    "bundle_id": "fake-bundle",
    "limits": {"max_batch": 64},
    **FAKE_CONTENTION_PLAN,
}


def rate(peer: str, round_index: int, workload: str = "single_stream") -> float:
    return BASE[peer] * FACTORS[peer][round_index] * SCALE[workload]


def expected_figure(peer: str, workload: str) -> dict:
    """The median factor is 2 for every peer; min and max are its factors' 1 and 4 or 8."""
    rounds = [rate(peer, n, workload) for n in range(3)]
    median, low, high = (BASE[peer] * SCALE[workload] * f for f in (2.0, 1.0, max(FACTORS[peer])))
    return {"median": median, "min": low, "max": high, "rounds": rounds, "tokens": TOKENS[workload]}


def fake_worker(calls: list[str]):
    """What each worker process would print, for the round it is in (how often it ran before)."""

    def run(name: str, plan_path: Path, env: dict, timeout: int) -> dict:
        round_index = calls.count(name)
        calls.append(name)
        if name in ("convert", "profile"):
            return {"pid": len(calls), "batches": {}}
        common = {"pid": len(calls), "threads": 1, "load_average_1min": 0.5}
        if name.startswith("contention_"):
            return common | fake_contention_worker(name, round_index)
        if name == "http":
            mixed = {"output_throughput": rate("http", round_index), "output_tokens": 8, "duration_s": 1.0}
            mixed |= {"server_cpu_seconds": 2.0, "client_cpu_seconds": 0.5}
            sweep = {"concurrency": {"1": {"ttft_ms": {"p50": rate("http", round_index) / 10}, "requests": 4}}}
            # Ours' workloads over HTTP: streamed at half the rate of not streamed.
            in_process = {
                f"{name}_{mode}": {"output_throughput": rate("http", round_index, workload) * factor}
                for name, workload in (("single_stream", "single_stream"), ("largest_batch", "batch_64"))
                for mode, factor in (("no_stream", 1.0), ("stream", 0.5))
            }
            return {**common, "mixed_concurrent": mixed, "sweep": sweep, "in_process_workloads": in_process}
        workloads = {}
        for workload in WORKLOADS[name]:
            run_figures = {"tokens_per_second": rate(name, round_index, workload), "tokens": TOKENS[workload]}
            workloads[workload] = run_figures | {"seconds": 1.0, "digests": ["d0", f"d1-{name}"]}
        if name == "transformers":
            workloads["mixed_static_batch"]["tokens_computed"] = 10
        matmul = {"peak_gflops": 1.0, "gflops_by_size": {"64": 1.0}} if name == "ours" else None
        return {**common, "workloads": workloads, **({"matmul": matmul} if matmul else {})}

    return run


def test_the_report_of_fake_rounds_has_exact_medians_spreads_and_goals(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(serving_bench, "prepare", lambda work, settings, sizes: FAKE_PLAN)
    monkeypatch.setattr(serving_bench, "run_worker", fake_worker(calls))

    results = run_serving_bench(rounds=3)

    forward, backward = list(PEERS), list(reversed(PEERS))
    contention = list(CONTENTION_PEERS)
    assert calls == ["convert", *forward, *backward, *forward, *contention, *contention[::-1], *contention, "profile"]
    assert results["method"]["orders"] == [forward, backward, forward]
    assert [record["order"] for record in results["contention_rounds"]] == [contention, contention[::-1], contention]
    assert [record["order"] for record in results["rounds"]] == [forward, backward, forward]
    figures, goals = results["figures"], results["goals"]
    single = figures["single_stream"]
    assert single["ours"] == expected_figure("ours", "single_stream")
    assert single["ours"] == {"median": 200.0, "min": 100.0, "max": 400.0, "rounds": [400.0, 100.0, 200.0], "tokens": 8}
    assert single["transformers"] == expected_figure("transformers", "single_stream")
    assert single["identical_outputs_vs_ours"] == {"transformers": "1/2", "ctranslate2": "1/2"}
    for size in ("16", "64"):
        for peer in ("ours", "transformers", "ctranslate2"):
            assert figures["batch_vs_ctranslate2"][size][peer] == expected_figure(peer, f"batch_{size}")
    http = figures["http_16_clients_mixed"]
    assert http["ours_http"] == {"median": 80.0, "min": 40.0, "max": 160.0, "rounds": [40.0, 160.0, 80.0], "tokens": 8}
    assert http["ours_in_process"] == expected_figure("ours", "mixed_batch")
    assert http["transformers_static_batch"] == expected_figure("transformers", "mixed_static_batch") | {
        "tokens_computed": 10
    }
    assert figures["serving_metrics"]["concurrency"] == {
        "1": {
            "ttft_ms": {"p50": {"median": 8.0, "min": 4.0, "max": 16.0, "rounds": [4.0, 16.0, 8.0]}},
            "requests": {"median": 4.0, "min": 4.0, "max": 4.0, "rounds": [4.0, 4.0, 4.0]},
        }
    }
    # Goals: ratios of the medians (not of means, nor of round 0), each met or missed against its target.
    # The contention goals' exact figures are checked in test_serving_contention.py.
    assert {name: (g["ratio"], g["met"]) for name, g in goals.items() if not name.startswith("contention_")} == {
        "single_stream_vs_transformers": (5.0, True),
        "batch_1_vs_ctranslate2": (2.0, True),
        "batch_16_vs_ctranslate2": (2.0, True),
        "batch_64_vs_ctranslate2": (2.0, True),
        "http_16_clients_vs_transformers_sequential": (2.0, False),
        "http_16_clients_vs_transformers_static_batch": (1.0, False),
        "http_16_clients_vs_ctranslate2_batch": (0.2, False),
        "flops_fraction_of_matmul_peak_at_batch_64": (2 * 1000 * 6400 / 1e9, False),
        # Per round, HTTP over in-process: 40 x (1, 4, 2) over 100 x (4, 1, 2), halved streamed:
        # the worse (streamed) is 0.05, 0.8, 0.2; its median 0.2.
        "http_1_client_vs_in_process": (pytest.approx(0.2), False),
        "http_64_clients_vs_in_process": (pytest.approx(0.2), False),
        # The medians at batch 64: 75 x 32 x 2 over 60 x 32 x 2.
        "int8_batch_64_vs_ctranslate2_int8": (pytest.approx(1.25), True),
    }
    assert figures["contention"]["goals"] == {name: goals[name] for name in goals if name.startswith("contention_")}
    int8 = figures["int8_vs_ctranslate2_int8"]
    for size, workload in (("1", "single_stream"), ("16", "batch_16"), ("64", "batch_64")):
        for peer in ("ours_int8", "ctranslate2_int8", "ours"):
            assert int8[size][peer] == expected_figure(peer, workload)
        assert int8[size]["int8_over_fp32"] == pytest.approx(0.75)
        assert int8[size]["identical_to_fp32"] == "1/2"
    versus = figures["http_vs_in_process"]["http_1_client_vs_in_process"]
    assert versus["no_stream"]["ratio"]["rounds"] == pytest.approx([0.1, 1.6, 0.4])
    assert versus["worse_ratio"]["rounds"] == pytest.approx([0.05, 0.8, 0.2])
    assert {name: goal["target"] for name, goal in goals.items()} == GOALS
    flops = figures["flops_at_batch_64"]
    assert flops["achieved_gflops"] == spread([2 * 1000 * rate("ours", n, "batch_64") / 1e9 for n in range(3)])
    assert flops["achieved_gflops"]["median"] == 2 * 1000 * 6400 / 1e9
    assert results["machine"]["torch_threads_per_peer"] == {p: [1, 1, 1] for p in PEERS[:-1]}


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
    # The contention workers, their servers and busy processes too: each condition a fresh process.
    (contention,) = results["contention_rounds"]
    assert contention["order"] == list(CONTENTION_PEERS)
    keys = ("pid", "server_pid", "busy_process_pid")
    pids += [contention[peer][key] for peer in CONTENTION_PEERS for key in keys if contention[peer].get(key)]
    assert all((contention[peer]["busy_process_pid"] is None) == peer.endswith("_alone") for peer in CONTENTION_PEERS)
    assert len(set(pids)) == len(pids) == len(PEERS) + 3 + len(CONTENTION_PEERS) + 4 + 3  # 4 servers, 3 busy
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
        at_most = name in AT_MOST_GOALS
        assert goal["comparison"] == ("<=" if at_most else ">=")
        assert goal["met"] == (goal["ratio"] <= goal["target"] if at_most else goal["ratio"] >= goal["target"])
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
    # Prompts of 4 lengths, 16 each: one attention over all 64 rows would attend padding, and the
    # four groups of 16 rows, re-seated by length, hold one length each: none.
    big = results["profile"]["batches"]["64"]
    assert big["attention_padding_share_one_group"] > 0.2
    assert big["attention_padding_share"] == 0.0
    machine = results["machine"]
    assert machine["cpus"] >= 1 and machine["threads"] == 1  # quick: one thread (speed is not judged)
    assert len(machine["load_average_at_start"]) == 3


@pytest.mark.e2e
def test_the_contention_workload_did_the_same_work_in_every_condition(results: dict) -> None:
    (record,) = results["contention_rounds"]
    figures = results["figures"]
    mixed_tokens = sum(figures["http_16_clients_mixed"]["max_new_tokens"])
    single_tokens = figures["single_stream"]["ours"]["tokens"]
    for peer in (peer for peer in CONTENTION_PEERS if "ctranslate2" not in peer):
        run = record[peer]
        assert run["server_exit_code"] == 0 and run["adapt_threads"] is ("baseline" not in peer)
        assert len(run["first_rounds"]) == 3 and run["single_stream"]["output_tokens"] == single_tokens
        for summary in (*run["first_rounds"], run["mixed_concurrent"]):
            assert (summary["requests"], summary["completed"], summary["output_tokens"]) == (16, 16, mixed_tokens)
        assert run["metrics_at_end"]["aieng_engine_threads"] >= 1
        assert run["metrics_at_end"]["aieng_cpu_other_processes_cores"] >= 0
    contention = figures["contention"]
    mixed_names = {"ours": "mixed_16_clients", "baseline": "mixed_16_clients", "ctranslate2": "mixed_batch_16"}
    for peer, mixed in mixed_names.items():
        assert set(contention[peer]["busy_over_alone"]) == {mixed, "single_stream"}
        rounds = ("first_round_seconds", "third_round_seconds") if peer != "ctranslate2" else ()
        for condition in ("alone", "busy"):
            figure = contention[peer][condition]
            assert figure[mixed]["tokens"] == mixed_tokens and figure["single_stream"]["tokens"] == single_tokens
            assert all(figure[name]["min"] > 0 for name in (mixed, "single_stream", *rounds)), (peer, condition)
    assert contention["goals"] == {name: results["goals"][name] for name in GOALS if name.startswith("contention_")}


def test_cli_runs_the_serving_suite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = {}

    def fake_bench(**kwargs) -> dict:
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("aieng_core.bench.serving_bench.run_serving_bench", fake_bench)
    with pytest.raises(SystemExit):
        cli.main(["bench", "serving", "--quick", "--out", str(tmp_path / "s.json")])
    assert seen["quick"] is True and seen["out"] == str(tmp_path / "s.json")


@pytest.mark.e2e
def test_the_int8_peers_ran_int8(results: dict) -> None:
    (record,) = results["rounds"]
    assert record["ctranslate2_int8"]["compute_type"] == "int8_float32"  # int8 matmuls, float32 elsewhere
    assert record["ctranslate2"]["compute_type"] == "float32"

    # Weight-only int8 is float32 compute: its steps are captured as float32's are. A bucket
    # either run left for serving.warmup_max_seconds (capture time depends on the machine's
    # load) says so, and is left out of the comparison: the buckets neither run cut are
    # compared, and they include the first, which both must have captured.
    def captured(peer: str) -> dict[int, bool]:
        buckets = record[peer]["engine_warmup"]["step_graphs"]["buckets"]
        return {b["batch"]: b["captured"] for b in buckets if "warmup_max_seconds" not in (b.get("reason") or "")}

    int8_buckets, float32_buckets = captured("ours_int8"), captured("ours")
    both = sorted(set(int8_buckets) & set(float32_buckets))
    assert both and both[0] == 1, (int8_buckets, float32_buckets)
    assert {b: int8_buckets[b] for b in both} == {b: float32_buckets[b] for b in both}
    assert int8_buckets[1] and float32_buckets[1]
    int8 = results["figures"]["int8_vs_ctranslate2_int8"]
    sizes = [size for size in int8 if size.isdigit()]
    batches = results["figures"]["batch_vs_ctranslate2"]
    assert sizes == sorted((size for size in batches if size.isdigit()), key=int)
    for size in sizes:
        row = int8[size]
        assert row["ours_int8"]["tokens"] == row["ours"]["tokens"] == row["ctranslate2_int8"]["tokens"] > 0
    assert "int8_batch_64_vs_ctranslate2_int8" in results["goals"]
