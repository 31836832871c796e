"""The report's parts without a model: the time budget, the prompts, the summary metrics and
the markdown table, on hand-made figures."""

from __future__ import annotations

from typing import Any

import pytest

from aieng_core.benchmark.budget import TimeBudget
from aieng_core.benchmark.speed import benchmark_prompts
from aieng_core.benchmark.summary import figures_markdown, summary_metrics


def reading(values: list[float]):
    """A clock that returns `values` in order and fails if read once more."""
    iterator = iter(values)
    return lambda: next(iterator)


def test_the_budget_allows_until_it_is_spent_then_skips_without_reading_the_clock() -> None:
    budget = TimeBudget(2.0, reading([10.0, 11.0, 12.0, 12.5]))
    assert budget.allows("a") and budget.allows("b")  # 1 s, then 2 s: not yet exceeded
    assert (budget.truncated, budget.reason()) == (False, None)
    assert budget.allows("c") is False  # 2.5 s
    assert budget.allows("d") is False  # the clock is not read again (it would raise)
    assert budget.skipped == ["c", "d"]
    assert budget.truncated is True
    assert budget.reason() == "benchmark.max_seconds (2 s) was exceeded after 2.500 s; not measured: c, d"


def test_prompts_are_distinct_windows_of_one_length_without_eos() -> None:
    vocabulary = {word: n for n, word in enumerate("abcdefghijklmnopqrstuvwxyz", start=1)}

    def encode(text: str) -> list[int]:
        return [vocabulary.get(ch, 0) for ch in text.lower() if ch in vocabulary or ch == " "]

    prompts = benchmark_prompts(encode, eos_token_id=0, count=5, length=7)  # spaces encode to the EOS id
    assert [len(p) for p in prompts] == [7] * 5
    assert all(0 not in p for p in prompts)
    assert len({tuple(p) for p in prompts}) == 5
    assert prompts[1][:-1] == prompts[0][1:]  # each window starts one token later
    assert benchmark_prompts(encode, 0, 5, 7) == prompts
    with pytest.raises(ValueError, match="encodes to no tokens"):
        benchmark_prompts(lambda text: [0, 0], 0, 1, 1)


REASON = "benchmark.max_seconds (9 s) was exceeded after 9.500 s; not measured: latency at concurrency 4"


def distribution(p50: float, p99: float) -> dict[str, float]:
    return {"mean": p50, "p50": p50, "p90": p99, "p99": p99}


def figure(rate: float, requests: int) -> dict[str, Any]:
    return {"requests": requests, "tokens": 8 * requests, "tokens_per_second": rate, "runs": [rate] * 3}


def hand_made() -> dict[str, Any]:
    return {
        "model_checkpoint_id": "m1",
        "parameters": 1000,
        "environment": {"threads": 2},
        "seconds": 3.25,
        "truncated": True,
        "truncated_reason": REASON,
        "quality": {
            "validation_loss": 2.0,
            "validation_perplexity": 7.389,
            "unigram_baseline_loss": 3.0,
            "unigram_baseline_perplexity": 20.09,
            "perplexity_vs_unigram": 0.368,
            "beats_unigram": True,
            "recorded_validation_loss": 2.0,
        },
        "throughput": [
            {
                "batch_size": 1,
                "ours": figure(100.0, 1),
                "transformers": figure(50.0, 1),
                "ratio_vs_transformers": 2.0,
            },
            {"batch_size": 4, "ours": figure(300.0, 4), "transformers": None, "ratio_vs_transformers": None},
        ],
        "latency": [
            {
                "concurrency": 1,
                "ttft_ms": distribution(1.0, 2.0),
                "tpot_ms": distribution(3.0, 4.0),
                "itl_ms": distribution(5.0, 6.0),
                "e2el_ms": distribution(7.0, 8.0),
                "output_throughput": 123.4,
            }
        ],
        "memory": {
            "peak_rss_bytes": 512 * 2**20,
            "budget_bytes": 2 * 2**30,
            "within_budget": True,
            "rule": "fp32 weights x 1.3 + 2 GiB",
        },
    }


def test_summary_metrics_are_flat_and_leave_out_what_was_not_measured() -> None:
    assert summary_metrics(hand_made()) == {
        "model_checkpoint_id": "m1",
        "parameters": 1000,
        "threads": 2,
        "seconds": 3.25,
        "truncated": True,
        "truncated_reason": REASON,
        "validation_loss": 2.0,
        "validation_perplexity": 7.389,
        "unigram_baseline_loss": 3.0,
        "unigram_baseline_perplexity": 20.09,
        "perplexity_vs_unigram": 0.368,
        "beats_unigram": True,
        "tokens_per_second_batch_1": 100.0,
        "transformers_tokens_per_second_batch_1": 50.0,
        "ratio_vs_transformers_batch_1": 2.0,
        "tokens_per_second_batch_4": 300.0,
        "ttft_p50_ms_concurrency_1": 1.0,
        "ttft_p99_ms_concurrency_1": 2.0,
        "tpot_p50_ms_concurrency_1": 3.0,
        "tpot_p99_ms_concurrency_1": 4.0,
        "itl_p50_ms_concurrency_1": 5.0,
        "itl_p99_ms_concurrency_1": 6.0,
        "e2el_p50_ms_concurrency_1": 7.0,
        "e2el_p99_ms_concurrency_1": 8.0,
        "peak_rss_bytes": 512 * 2**20,
        "memory_budget_bytes": 2 * 2**30,
        "within_memory_budget": True,
    }


def test_the_markdown_table_shows_every_measured_row() -> None:
    assert figures_markdown(hand_made()).splitlines() == [
        f"**truncated**: {REASON}",
        "",
        "| validation loss | perplexity | unigram baseline loss | unigram perplexity | recorded at training |",
        "|---|---|---|---|---|",
        "| 2.0000 | 7.39 | 3.0000 | 20.09 | 2.0000 |",
        "",
        "| batch | ours tok/s | transformers tok/s | ours / transformers |",
        "|---|---|---|---|",
        "| 1 | 100.0 | 50.0 | 2.00 |",
        "| 4 | 300.0 | n/a | n/a |",
        "",
        "| in flight | TTFT P50 | TTFT P99 | TPOT P50 | TPOT P99 | ITL P50 | ITL P99 | E2EL P50 | E2EL P99 | tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| 1 | 1.00 | 2.00 | 3.00 | 4.00 | 5.00 | 6.00 | 7.00 | 8.00 | 123.4 |",
        "",
        "latency in ms, measured in process through the threaded engine loop",
        "",
        "peak RSS 512 MiB, within the budget of 2.00 GiB (fp32 weights x 1.3 + 2 GiB); report measured in 3.2 s",
    ]
