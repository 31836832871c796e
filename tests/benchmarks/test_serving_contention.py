"""The serving benchmark's contention workload (aieng_core/bench/serving_contention.py): its
report on fake rounds to the exact number, which side of its target each goal is met on, and
the busy process's life. The quick run's contention workers are checked in
test_serving_bench.py, beside the rest of that run.

The fake rounds answer with numbers chosen so that the median of the rounds, their mean, the
first round and the median of per-round ratios all differ: each goal must be a ratio of the
medians of this run.
"""

from __future__ import annotations

import pytest

from aieng_core.bench.serving_contention import busy_process
from aieng_core.bench.serving_plan import CONTENTION_PEERS
from aieng_core.bench.serving_report import AT_MOST_GOALS, GOALS, contention_figures, judged, spread

# What the contention report reads of the plan beside its mixed requests (test_serving_bench.py's
# fake plan has those); 8 tokens in each workload.
FAKE_CONTENTION_PLAN = {
    "single_stream_requests": [{"max_new_tokens": 4}, {"max_new_tokens": 4}],
    "contention_servers": {"ours": {"adapt_threads": True}, "baseline": {"adapt_threads": False}},
}
PLAN = {**FAKE_CONTENTION_PLAN, "mixed": [{"ids": [5, 6], "max_new_tokens": 3}, {"ids": [7], "max_new_tokens": 5}]}
# (16 clients, single stream) tok/s at factor 1; alone at (4, 1, 2) x that over the rounds, busy at
# (1, 2, 8) x: both medians 2, while the per-round ratios busy / alone (1/4, 2, 4) have another.
CONTENTION_RATES = {
    "ours": {"alone": (1000.0, 100.0), "busy": (600.0, 30.0)},
    "baseline": {"alone": (2000.0, 120.0), "busy": (20.0, 2.0)},
    "ctranslate2": {"alone": (7000.0, 400.0), "busy": (3500.0, 300.0)},
}
CONTENTION_FACTORS = {"alone": (4.0, 1.0, 2.0), "busy": (1.0, 2.0, 8.0)}
# Seconds of the 3 rounds after ready: the first's median 2.4, the third's 2.0 (ratio 1.2), where
# the median of the per-round ratios (4.8, 0.6, 0.3) would be 0.6.
FIRST_ROUND_SECONDS, THIRD_ROUND_SECONDS = (4.8, 1.2, 2.4), (1.0, 2.0, 8.0)


def fake_contention_worker(name: str, round_index: int) -> dict:
    """What contention worker `name` would print in round `round_index`."""
    _, peer, condition = name.split("_")
    mixed, single = (rate * CONTENTION_FACTORS[condition][round_index] for rate in CONTENTION_RATES[peer][condition])
    common = {"pid": 1, "load_average_1min": 0.5}
    common |= {"busy_process_pid": None} if condition == "alone" else {"busy_process_pid": 2, "busy_process_cores": 1.0}
    if peer == "ctranslate2":
        workloads = {"mixed_batch": {"tokens_per_second": mixed, "tokens": 8}}
        workloads["single_stream"] = {"tokens_per_second": single, "tokens": 8}
        return {**common, "workloads": workloads}
    rounds = [
        {"output_tokens": 8, "duration_s": seconds}
        for seconds in (FIRST_ROUND_SECONDS[round_index], 9.0, THIRD_ROUND_SECONDS[round_index])
    ]
    threads = 1.0 if condition == "busy" else 2.0
    return {
        **common,
        "first_rounds": rounds,
        "mixed_concurrent": {"output_throughput": mixed, "output_tokens": 8},
        "single_stream": {"output_throughput": single, "output_tokens": 8},
        "metrics_at_end": {"aieng_engine_threads": threads, "aieng_cpu_other_processes_cores": 2.0 - threads},
        "ready_seconds": 1.0,
    }


def fake_rounds() -> list[dict]:
    return [{peer: fake_contention_worker(peer, index) for peer in CONTENTION_PEERS} for index in range(3)]


def test_the_contention_report_of_fake_rounds_has_exact_medians_spreads_and_goals() -> None:
    section, goals = contention_figures(PLAN, fake_rounds())

    # Medians over medians: 1200 / 2000; 60 / 200; 2000 / 4000; 2.4 s / 2.0 s (at most 1.5).
    assert {name: (goal["ratio"], goal["met"]) for name, goal in goals.items()} == {
        "contention_16_clients_busy_vs_alone": (pytest.approx(0.6), True),
        "contention_single_stream_busy_vs_alone": (pytest.approx(0.3), False),
        "contention_16_clients_alone_vs_spin_waiting_baseline": (pytest.approx(0.5), False),
        "contention_first_round_over_third_busy": (pytest.approx(1.2), True),
    }
    assert {name: (goal["target"], goal["comparison"]) for name, goal in goals.items()} == {
        name: (GOALS[name], "<=" if name in AT_MOST_GOALS else ">=") for name in goals
    }
    assert section["goals"] == goals
    ours = section["ours"]
    assert ours["busy"]["mixed_16_clients"] == {
        "median": 1200.0,
        "min": 600.0,
        "max": 4800.0,
        "rounds": [600.0, 1200.0, 4800.0],
        "tokens": 8,
    }
    assert ours["alone"]["single_stream"] == spread([400.0, 100.0, 200.0]) | {"tokens": 8}
    assert ours["busy"]["first_round_seconds"] == spread(list(FIRST_ROUND_SECONDS))
    assert ours["busy"]["third_round_seconds"] == spread(list(THIRD_ROUND_SECONDS))
    assert ours["busy"]["first_over_third"] == pytest.approx(1.2)
    assert ours["busy"]["engine_threads_at_end"] == spread([1.0, 1.0, 1.0])
    assert ours["busy"]["busy_process_cores"] == spread([1.0, 1.0, 1.0])
    assert "busy_process_cores" not in ours["alone"]
    assert section["baseline"]["busy_over_alone"] == {
        "mixed_16_clients": pytest.approx(0.01),
        "single_stream": pytest.approx(2 / 120),
    }
    ctranslate2 = section["ctranslate2"]
    assert ctranslate2["alone"]["mixed_batch_16"] == spread([28000.0, 7000.0, 14000.0]) | {"tokens": 8}
    assert ctranslate2["busy_over_alone"] == {"mixed_batch_16": 0.5, "single_stream": 0.75}
    assert section["max_new_tokens"] == [3, 5] and section["single_stream_max_new_tokens"] == [4, 4]


def test_a_server_that_got_other_token_counts_is_refused() -> None:
    rounds = fake_rounds()
    rounds[1]["contention_ours_busy"]["first_rounds"][0]["output_tokens"] = 7
    with pytest.raises(RuntimeError, match=r"ours busy first rounds: \[7, 8, 8\] tokens where 8 were asked for"):
        contention_figures(PLAN, rounds)


@pytest.mark.parametrize(
    ("name", "ratio", "met"),
    [
        ("contention_16_clients_busy_vs_alone", 0.5, True),  # at least 0.5
        ("contention_16_clients_busy_vs_alone", 0.49, False),
        ("contention_first_round_over_third_busy", 1.5, True),  # at most 1.5
        ("contention_first_round_over_third_busy", 1.51, False),
        ("contention_first_round_over_third_busy", 0.9, True),
    ],
)
def test_a_goal_is_met_on_its_own_side_of_the_target(name: str, ratio: float, met: bool) -> None:
    assert judged(name, ratio)["met"] is met


def test_the_busy_process_spins_until_the_block_ends_even_when_it_fails() -> None:
    with busy_process("alone") as none:
        assert none is None
    with pytest.raises(RuntimeError, match="measurement failed"), busy_process("busy") as busy:
        assert busy is not None and busy.poll() is None  # running
        raise RuntimeError("measurement failed")
    assert busy.poll() is not None  # killed and reaped
    with pytest.raises(ValueError, match="condition"), busy_process("idle"):
        pass
