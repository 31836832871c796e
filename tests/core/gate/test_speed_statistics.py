"""The speed decision on fixed latencies: the interval, the limit, the pairing, determinism."""

from __future__ import annotations

import random

import pytest

from aieng_core.gate.speed_statistics import decide, open_question, paired_bootstrap, ratio_of_medians


def rounds_of(candidate_scale: float, *, seed: int = 1, rounds: int = 2, n: int = 24, shift: float = 1.0) -> list:
    """`rounds` rounds of `n` requests whose work cycles 16/32/64 tokens (as the gate's do),
    each latency with 5% noise; round r's machine is `shift`**r slower for both sides."""
    rng = random.Random(seed)
    made = []
    for r in range(rounds):
        work = [(16, 32, 64)[i % 3] * 2.0 * shift**r for i in range(n)]
        deployed = [w * rng.uniform(0.95, 1.05) for w in work]
        candidate = [w * candidate_scale * rng.uniform(0.95, 1.05) for w in work]
        made.append((candidate, deployed))
    return made


def test_the_same_speed_is_no_regression() -> None:
    decision = decide(rounds_of(1.0), max_regression=0.10, confidence=0.99)
    assert decision["regression"] is False and decision["limit"] == pytest.approx(1.10)
    low, high = decision["interval"]
    assert low <= decision["ratio"] <= high and low < 1.0 < high
    assert decision["requests"] == 48 and decision["verdict"].startswith("no regression")


def test_twice_as_slow_is_a_regression() -> None:
    decision = decide(rounds_of(2.0), max_regression=0.10, confidence=0.99)
    assert decision["regression"] is True and decision["interval"][0] > 1.10
    assert decision["ratio"] == pytest.approx(2.0, rel=0.1)
    assert decision["verdict"].startswith("slower: median latency x")


def test_a_ratio_above_the_limit_that_noise_explains_passes() -> None:
    """Two requests per round: a point estimate above 1.10 is not evidence."""
    noisy = [([10.0, 30.0], [9.0, 26.0]), ([31.0, 11.0], [28.0, 10.0])]
    decision = decide(noisy, max_regression=0.10, confidence=0.99)
    assert decision["ratio"] > 1.10 and decision["interval"][0] <= 1.10
    assert decision["regression"] is False and decision["verdict"].startswith("not shown slower")


def test_a_slowdown_both_sides_share_is_not_the_candidates() -> None:
    """Round 2 ran on a machine 3x slower for both bundles: pairs within rounds cancel it."""
    decision = decide(rounds_of(1.0, shift=3.0), max_regression=0.10, confidence=0.99)
    assert decision["regression"] is False and decision["ratio"] == pytest.approx(1.0, abs=0.08)


def test_the_interval_is_the_same_for_the_same_data() -> None:
    data = rounds_of(1.05, seed=3)
    assert paired_bootstrap(data, 0.99) == paired_bootstrap(data, 0.99)
    narrow, wide = paired_bootstrap(data, 0.8), paired_bootstrap(data, 0.99)
    assert wide[0] <= narrow[0] <= narrow[1] <= wide[1]


def test_ratio_of_medians() -> None:
    assert ratio_of_medians([1.0, 2.0, 30.0], [1.0, 1.0, 1.0]) == 2.0


def test_rounds_need_the_same_requests_on_both_sides() -> None:
    with pytest.raises(ValueError, match="same positive number of requests on both sides"):
        paired_bootstrap([([1.0, 2.0], [1.0])], 0.9)


def test_only_an_open_answer_earns_another_round() -> None:
    same = decide(rounds_of(1.0), max_regression=0.10, confidence=0.99)
    slower = decide(rounds_of(1.5), max_regression=0.10, confidence=0.99)
    assert (same["regression"], open_question(same)) == (False, False)  # a clear pass
    assert (slower["regression"], open_question(slower)) == (True, False)  # a clear failure
    # Slower by 20% with noise of +-60% and 3 requests a round: the median is above the limit,
    # the interval reaches below it.
    rng = random.Random(7)
    noisy = [
        ([1.2 * rng.uniform(0.4, 1.6) for _ in range(3)], [rng.uniform(0.4, 1.6) for _ in range(3)]) for _ in range(2)
    ]
    open_decision = decide(noisy, max_regression=0.10, confidence=0.99)
    low, _ = open_decision["interval"]
    assert open_decision["ratio"] > 1.10 and low <= 1.10
    assert open_question(open_decision) is True
    assert open_decision["verdict"].startswith("not shown slower")
