"""Sampling: greedy is argmax, a seed reproduces a request's tokens whatever shares its batch,
the top-k and top-p cuts, and temperature shaping the distribution."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from aieng_core.serving.request import FAILED_TOKEN, Request, RequestError, SamplingParams
from aieng_core.serving.sampling import make_generator, sample

VOCAB = 50


def request(params: SamplingParams, request_id: str = "r") -> Request:
    return Request(request_id, [1], params, generator=None if params.greedy else make_generator(params))


def random_logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def draw_counts(probs: list[float], params: SamplingParams, draws: int) -> Counter[int]:
    logits = torch.tensor([[math.log(p) for p in probs]])
    r = request(params)
    return Counter(sample(logits, [r])[0] for _ in range(draws))


def test_greedy_rows_take_the_argmax() -> None:
    logits = random_logits(6, seed=0)
    requests = [request(SamplingParams(max_new_tokens=1), f"r{i}") for i in range(6)]

    assert sample(logits, requests) == torch.argmax(logits, dim=-1).tolist()


def test_greedy_takes_the_first_of_tied_maxima() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 7] = logits[0, 3] = logits[0, 40] = 5.0

    assert sample(logits, [request(SamplingParams(max_new_tokens=1))]) == [3]


def test_greedy_works_on_reduced_precision_logits() -> None:
    logits = random_logits(3, seed=1)
    requests = [request(SamplingParams(max_new_tokens=1), f"r{i}") for i in range(3)]

    assert sample(logits.to(torch.bfloat16), requests) == torch.argmax(logits.to(torch.bfloat16), dim=-1).tolist()


def test_an_empty_batch_samples_nothing() -> None:
    assert sample(torch.zeros(0, VOCAB), []) == []


def test_logits_rows_must_match_the_requests() -> None:
    with pytest.raises(ValueError, match=r"shape \(2, 50\) do not match 3 requests"):
        sample(random_logits(2, seed=0), [request(SamplingParams(max_new_tokens=1), f"r{i}") for i in range(3)])


def test_a_seeded_request_draws_the_same_tokens_alone_or_in_any_batch() -> None:
    params = SamplingParams(max_new_tokens=1, temperature=0.9, top_k=30, top_p=0.95, seed=1234)
    row = random_logits(1, seed=5)[0] / 3  # flat enough that every draw is a real choice

    alone = request(params)
    alone_tokens = [sample(row[None], [alone])[0] for _ in range(40)]

    batched = request(params)
    batched_tokens = []
    for step in range(40):
        others = [
            request(SamplingParams(max_new_tokens=1, temperature=1.3, seed=None), "o0"),
            request(SamplingParams(max_new_tokens=1), "o1"),
            request(SamplingParams(max_new_tokens=1, temperature=0.5, top_p=0.8, seed=step), "o2"),
            request(SamplingParams(max_new_tokens=1, temperature=2.0, top_k=3, seed=None), "o3"),
        ]
        logits = random_logits(5, seed=100 + step)
        logits[2] = row
        batch = [others[0], others[1], batched, others[2], others[3]]
        batched_tokens.append(sample(logits, batch)[2])

    assert batched_tokens == alone_tokens
    assert len(set(alone_tokens)) > 5  # really sampled, not a constant
    other_seed = request(SamplingParams(max_new_tokens=1, temperature=0.9, top_k=30, top_p=0.95, seed=1235))
    assert [sample(row[None], [other_seed])[0] for _ in range(40)] != alone_tokens


def test_a_missing_generator_is_made_from_the_seed_on_first_use() -> None:
    params = SamplingParams(max_new_tokens=1, temperature=1.0, seed=99)
    row = random_logits(1, seed=2) / 3
    lazy = Request("lazy", [1], params)
    made = request(params)

    lazy_tokens = [sample(row, [lazy])[0] for _ in range(20)]

    assert isinstance(lazy.generator, torch.Generator)
    assert lazy_tokens == [sample(row, [made])[0] for _ in range(20)]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=1, temperature=1.5, top_k=1),
        SamplingParams(max_new_tokens=1, temperature=1.5, top_p=1e-6),
    ],
)
def test_top_k_one_and_a_tiny_top_p_are_greedy(params: SamplingParams) -> None:
    logits = random_logits(8, seed=3) / 3
    for seed in range(5):
        requests = [request(replace(params, seed=seed * 8 + i), f"r{i}") for i in range(8)]
        assert sample(logits, requests) == torch.argmax(logits, dim=-1).tolist()


def test_top_k_one_breaks_ties_as_argmax_does() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 9] = logits[0, 4] = 5.0

    assert sample(logits, [request(SamplingParams(max_new_tokens=1, temperature=1.0, top_k=1, seed=0))]) == [4]


def test_temperature_one_draws_in_proportion_to_the_probabilities() -> None:
    counts = draw_counts([0.5, 0.3, 0.2], SamplingParams(max_new_tokens=1, temperature=1.0, seed=0), draws=4000)

    assert dict(counts) == {0: 2030, 1: 1209, 2: 761}
    assert [abs(counts[i] / 4000 - p) < 0.03 for i, p in enumerate([0.5, 0.3, 0.2])] == [True] * 3


def test_a_low_temperature_sharpens_and_a_high_one_flattens() -> None:
    sharp = draw_counts([0.5, 0.3, 0.2], SamplingParams(max_new_tokens=1, temperature=0.5, seed=0), draws=4000)
    flat = draw_counts([0.5, 0.3, 0.2], SamplingParams(max_new_tokens=1, temperature=4.0, seed=0), draws=4000)

    # temperature 0.5 squares the probabilities: 0.25 : 0.09 : 0.04 -> 0.658, 0.237, 0.105
    assert dict(sharp) == {0: 2663, 1: 912, 2: 425}
    # temperature 4 takes their fourth root: 0.841 : 0.740 : 0.669 -> 0.373, 0.330, 0.297
    assert dict(flat) == {0: 1502, 1: 1353, 2: 1145}


def test_top_k_never_draws_outside_the_k_most_likely() -> None:
    counts = draw_counts(
        [0.4, 0.1, 0.3, 0.2], SamplingParams(max_new_tokens=1, temperature=1.0, top_k=2, seed=7), draws=2000
    )

    assert sorted(counts) == [0, 2]
    assert dict(counts) == {0: 1128, 2: 872}  # renormalised 0.4 : 0.3 -> 0.571, 0.429


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = [0.5, 0.3, 0.2]
    nucleus = draw_counts(probs, SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.6, seed=7), draws=2000)
    first_only = draw_counts(probs, SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.45, seed=7), draws=200)
    everything = draw_counts(probs, SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.99, seed=7), draws=2000)

    assert sorted(nucleus) == [0, 1]  # 0.5 < 0.6 <= 0.8
    assert dict(first_only) == {0: 200}
    assert sorted(everything) == [0, 1, 2]


# Binary fractions: their logs go through softmax and cumsum exactly in float32, so the
# cumulative mass is exactly 0.5, 0.75, 0.875, 1.0 and a cut at p = 0.75 is a tie, not a rounding.
EXACT = [1 / 2, 1 / 4, 1 / 8, 1 / 8]
ABOVE_THREE_QUARTERS = float(np.nextafter(np.float32(0.75), np.float32(1.0)))  # 0.75 + 2**-24


def test_binary_fraction_probabilities_are_exact_in_float32() -> None:
    probs = torch.softmax(torch.tensor([math.log(p) for p in EXACT]), dim=-1)

    assert probs.tolist() == EXACT
    assert torch.cumsum(probs, dim=-1).tolist() == [0.5, 0.75, 0.875, 1.0]


def test_top_p_of_exactly_the_mass_of_a_prefix_keeps_that_prefix_and_nothing_more() -> None:
    # 1/2 + 1/4 reaches 0.75 exactly: the first two tokens are the smallest prefix reaching p.
    at_p = draw_counts(EXACT, SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.75, seed=11), draws=3000)
    # Renormalised 1/2 : 1/4 -> 2/3 : 1/3; the third token (1/8 of the mass) is never drawn.
    assert sorted(at_p) == [0, 1]
    assert abs(at_p[0] / 3000 - 2 / 3) < 0.03
    half = draw_counts(EXACT, SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.5, seed=11), draws=300)
    assert dict(half) == {0: 300}  # 1/2 reaches 0.5 on its own


def test_top_p_just_above_the_mass_of_a_prefix_keeps_one_token_more() -> None:
    # The smallest float32 above 0.75: 1/2 + 1/4 no longer reaches it, 1/2 + 1/4 + 1/8 does.
    above = draw_counts(
        EXACT, SamplingParams(max_new_tokens=1, temperature=1.0, top_p=ABOVE_THREE_QUARTERS, seed=11), draws=3000
    )
    # Renormalised 4/7 : 2/7 : 1/7; the fourth token (the other 1/8) is never drawn.
    assert sorted(above) == [0, 1, 2]
    assert abs(above[2] / 3000 - 1 / 7) < 0.03


def test_top_k_applies_before_top_p() -> None:
    # top_k=2 renormalises 0.4 : 0.3 to 0.571 : 0.429, and 0.571 reaches top_p 0.55 alone.
    counts = draw_counts(
        [0.4, 0.1, 0.3, 0.2], SamplingParams(max_new_tokens=1, temperature=1.0, top_k=2, top_p=0.55, seed=7), 200
    )

    assert dict(counts) == {0: 200}


def test_make_generator_uses_the_seed_or_fresh_entropy() -> None:
    assert make_generator(SamplingParams(max_new_tokens=1, seed=42)).initial_seed() == 42
    assert make_generator(SamplingParams(max_new_tokens=1, seed=2**64 - 1)).initial_seed() == 2**64 - 1
    unseeded = {make_generator(SamplingParams(max_new_tokens=1)).initial_seed() for _ in range(3)}
    assert len(unseeded) == 3


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: make_generator(SamplingParams(max_new_tokens=1, seed=-1)), "seed"),
        (lambda: make_generator(SamplingParams(max_new_tokens=1, seed=2**64)), "seed"),
        (lambda: SamplingParams(max_new_tokens=1, temperature=-0.1), "temperature"),
        (lambda: SamplingParams(max_new_tokens=1, temperature=float("nan")), "temperature"),
        (lambda: SamplingParams(max_new_tokens=1, top_k=-1), "top_k"),
        (lambda: SamplingParams(max_new_tokens=1, top_p=0.0), "top_p"),
        (lambda: SamplingParams(max_new_tokens=1, top_p=1.5), "top_p"),
        (lambda: SamplingParams(max_new_tokens=0), "max_new_tokens"),
        (lambda: SamplingParams(max_new_tokens=1, presence_penalty=2.5), "presence_penalty"),
        (lambda: SamplingParams(max_new_tokens=1, frequency_penalty=float("nan")), "frequency_penalty"),
        (lambda: SamplingParams(max_new_tokens=1, logit_bias=((3, 101.0),)), "logit_bias"),
        (lambda: SamplingParams(max_new_tokens=1, logit_bias=((-1, 1.0),)), "logit_bias"),
    ],
)
def test_invalid_parameters_raise_a_request_error_naming_the_field(build, field: str) -> None:
    with pytest.raises(RequestError) as raised:
        build()
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


def test_a_temperature_below_the_greedy_threshold_is_greedy() -> None:
    from aieng_core.serving.request import GREEDY_TEMPERATURE

    assert SamplingParams(max_new_tokens=1, temperature=GREEDY_TEMPERATURE / 10).greedy
    assert SamplingParams(max_new_tokens=1, temperature=1e-45).greedy
    assert not SamplingParams(max_new_tokens=1, temperature=GREEDY_TEMPERATURE).greedy


def test_inverse_cdf_draws_match_the_probabilities_over_many_draws() -> None:
    """The batched draw (one uniform per row, searched in the row's CDF) is unbiased: 30,000
    draws of five rows at once land within 1% of every probability (3.5 standard errors)."""
    probs = [0.4, 0.25, 0.2, 0.1, 0.05]
    logits = torch.tensor([[math.log(p) for p in probs]] * 5)
    requests = [request(SamplingParams(max_new_tokens=1, temperature=1.0, seed=seed), f"r{seed}") for seed in range(5)]
    counts: Counter[int] = Counter()
    for _ in range(6000):
        counts.update(sample(logits, requests))
    assert [abs(counts[i] / 30000 - p) < 0.01 for i, p in enumerate(probs)] == [True] * 5


# ---- logit_bias and the presence and frequency penalties (OpenAI's definitions) ----------------


def with_output(params: SamplingParams, output: list[int], request_id: str = "r") -> Request:
    made = request(params, request_id)
    made.output_ids = list(output)
    return made


def test_logit_bias_moves_only_its_own_row() -> None:
    logits = random_logits(3, seed=11)
    plain = sample(logits, [request(SamplingParams(max_new_tokens=1)) for _ in range(3)])
    target = (plain[1] + 1) % VOCAB
    biased = request(SamplingParams(max_new_tokens=1, logit_bias=((target, 100.0),)))
    banned = request(SamplingParams(max_new_tokens=1, logit_bias=((plain[2], -100.0),)))
    got = sample(logits, [request(SamplingParams(max_new_tokens=1)), biased, banned])
    assert got[0] == plain[0] and got[1] == target and got[2] != plain[2]
    assert got[2] == int(torch.topk(logits[2], 2).indices[1])  # the runner-up, once the best is banned


def test_frequency_and_presence_penalties_count_the_output_tokens() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 6] = 3.0, 2.0
    for params, output, expected in [
        (SamplingParams(max_new_tokens=1, frequency_penalty=0.6), [5], 5),  # 3 - 0.6 > 2
        (SamplingParams(max_new_tokens=1, frequency_penalty=0.6), [5, 5], 6),  # 3 - 1.2 < 2
        (SamplingParams(max_new_tokens=1, presence_penalty=0.9), [5, 5, 5], 5),  # once: 3 - 0.9 > 2
        (SamplingParams(max_new_tokens=1, presence_penalty=1.1), [5], 6),  # 3 - 1.1 < 2
        (SamplingParams(max_new_tokens=1, frequency_penalty=-2.0), [6], 6),  # negative: encourages
    ]:
        assert sample(logits, [with_output(params, output)]) == [expected], (params, output)
    # The prompt is not counted (as in vLLM: OpenAI's penalties are on the text generated so far).
    prompt_only = Request("p", [5, 5, 5], SamplingParams(max_new_tokens=1, frequency_penalty=2.0))
    assert sample(logits, [prompt_only]) == [5]


def test_adjusted_rows_leave_the_logits_of_the_others_untouched() -> None:
    logits = random_logits(4, seed=3)
    before = logits.clone()
    rows = [request(SamplingParams(max_new_tokens=1)) for _ in range(4)]
    rows[2] = with_output(SamplingParams(max_new_tokens=1, frequency_penalty=1.0), [1, 2, 2])
    sample(logits, rows)
    assert torch.equal(logits, before)  # the caller's tensor is never changed in place


def test_a_seeded_penalized_request_draws_the_same_tokens_in_any_batch() -> None:
    params = SamplingParams(max_new_tokens=1, temperature=1.0, seed=42, presence_penalty=1.5, logit_bias=((4, 3.0),))
    logits = random_logits(3, seed=9)
    alone = sample(logits[1:2], [with_output(params, [7, 7, 8])])
    others = [request(SamplingParams(max_new_tokens=1, temperature=0.7, seed=n)) for n in (1, 2)]
    batched = sample(logits, [others[0], with_output(params, [7, 7, 8]), others[1]])
    assert batched[1] == alone[0]


def test_logprobs_are_the_raw_distributions_whatever_the_adjustments() -> None:
    logits = random_logits(3, seed=21)
    rows = [
        request(SamplingParams(max_new_tokens=1, logprobs=3)),
        request(SamplingParams(max_new_tokens=1)),  # asks for none: gets none
        request(SamplingParams(max_new_tokens=1, logprobs=0, temperature=1.0, seed=3, logit_bias=((7, 100.0),))),
    ]
    tokens = sample(logits, rows)
    expected = torch.log_softmax(logits, dim=-1)
    [greedy] = rows[0].logprobs
    assert greedy.token == tokens[0] and greedy.logprob == pytest.approx(float(expected[0, tokens[0]]), abs=1e-6)
    top_ids = torch.argsort(expected[0], descending=True, stable=True)[:3].tolist()
    assert [t for t, _ in greedy.top] == top_ids and greedy.top[0][0] == tokens[0]  # greedy: the most likely
    assert [v for _, v in greedy.top] == pytest.approx(expected[0, top_ids].tolist(), abs=1e-6)
    assert rows[1].logprobs == []
    # The biased token is drawn, and its log-probability is the model's, not the biased one's.
    [biased] = rows[2].logprobs
    assert biased.token == tokens[2] == 7 and biased.top == ()
    assert biased.logprob == pytest.approx(float(expected[2, 7]), abs=1e-6) and biased.logprob < -0.5


def test_a_row_that_fails_records_no_logprob() -> None:
    logits = random_logits(2, seed=5)
    logits[1] = float("nan")
    rows = [request(SamplingParams(max_new_tokens=1, logprobs=1, temperature=1.0, seed=s)) for s in (1, 2)]
    tokens = sample(logits, rows)
    assert tokens[1] == FAILED_TOKEN
    assert len(rows[0].logprobs) == 1 and rows[1].logprobs == []
