"""`n` samples of one prompt: prefilled once, forked into a slot each, and each sample the same
as that request alone; admitted together; a sample or the prompt's request leaving early never
strands the others."""

from __future__ import annotations

import pytest

from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.serving.request import RequestError, SamplingParams

PROMPT = [5 + (n * 7) % 200 for n in range(30)]


def _engine(model, tokenizer, max_batch: int = 8, max_prefill_tokens: int = 512, prefix: int = 0) -> Engine:
    limits = EngineLimits(max_batch=max_batch, max_context=64, max_waiting=64, max_prefill_tokens=max_prefill_tokens)
    return Engine(model, tokenizer, limits, model.config.eos_token_id, prefix_cache_tokens=prefix)


def _sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed, ignore_eos=True)


def _run(engine: Engine, requests=()) -> dict[int, tuple[int, ...]]:
    """Queues `requests`, then steps until every request finished; each one's tokens, by id(request)."""
    return {key: tokens for key, (_, tokens) in _finish(engine, requests).items()}


def _finish(engine: Engine, requests=()) -> dict[int, tuple[str | None, tuple[int, ...]]]:
    """Queues `requests`, then steps until every request finished; each one's finish reason
    and tokens, by id(request)."""
    for request in requests:
        engine.enqueue(request)
    done = {}
    while engine.has_work:
        for request, output in engine.step():
            if output.finished:
                done[id(request)] = (output.finish_reason, output.token_ids)
    return done


def _alone(model, tokenizer, params: SamplingParams, prompt=PROMPT) -> tuple[int, ...]:
    return _engine(model, tokenizer).generate([prompt], params)[0].token_ids


@pytest.mark.parametrize("chunk", [512, 8])  # the whole prompt in one step, and in chunks of 8
def test_each_sample_is_what_its_seed_gives_alone_and_the_prompt_is_prefilled_once(
    sensitive_model, tiny_tokenizer, chunk
) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, max_prefill_tokens=chunk)
    requests = engine.prepare_samples(PROMPT, [(f"r-{n}", _sampled(40 + n)) for n in range(4)])
    prefilled = []
    for request in requests:
        engine.enqueue(request)
    done = {}
    while engine.has_work:
        for request, output in engine.step():
            if output.finished:
                done[id(request)] = output.token_ids
        assert engine.last_step is not None
        prefilled.append(engine.last_step.prefill_tokens)
    assert sum(prefilled) == len(PROMPT)  # once, not four times
    expected = [_alone(sensitive_model, tiny_tokenizer, _sampled(40 + n)) for n in range(4)]
    assert len(set(expected)) == 4  # distinct: a sample given another's keys or generator would show
    assert [done[id(r)] for r in requests] == expected
    assert engine.pool.free_slots == 8


def test_greedy_samples_equal_the_greedy_answer(sensitive_model, tiny_tokenizer) -> None:
    greedy = SamplingParams(max_new_tokens=10, ignore_eos=True)
    engine = _engine(sensitive_model, tiny_tokenizer)
    requests = engine.prepare_samples(PROMPT, [("g", greedy)] * 3)
    done = _run(engine, requests)
    assert {done[id(r)] for r in requests} == {_alone(sensitive_model, tiny_tokenizer, greedy)}


def test_the_samples_of_a_prompt_take_their_slots_together(sensitive_model, tiny_tokenizer) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, max_batch=4)
    busy = engine.prepare("busy", [7, 8, 9], SamplingParams(max_new_tokens=3, ignore_eos=True))
    engine.enqueue(busy)
    engine.step()  # busy holds one of the 4 slots
    requests = engine.prepare_samples(PROMPT, [(f"r-{n}", _sampled(n)) for n in range(4)])
    for request in requests:
        engine.enqueue(request)
    steps_waiting = 0
    while not busy.finished:
        engine.step()
        if not busy.finished:
            assert all(r.slot is None for r in requests)  # 3 free slots do not take 4 samples
            steps_waiting += 1
    assert steps_waiting == 1
    engine.step()
    assert sorted(r.slot for r in requests) == [0, 1, 2, 3]


def test_a_sample_cancelled_before_the_fork_frees_its_slot_and_the_others_go_on(
    sensitive_model, tiny_tokenizer
) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, max_prefill_tokens=8)
    requests = engine.prepare_samples(PROMPT, [(f"r-{n}", _sampled(70 + n)) for n in range(3)])
    for request in requests:
        engine.enqueue(request)
    engine.step()  # admitted; the first chunk of 8 of 30 prompt tokens
    requests[1].cancel()
    done = _finish(engine)
    assert [done[id(r)][0] for r in requests] == ["length", "cancelled", "length"]
    assert done[id(requests[1])][1] == ()
    assert done[id(requests[2])][1] == _alone(sensitive_model, tiny_tokenizer, _sampled(72))
    assert engine.pool.free_slots == 8


def test_when_the_prompts_request_leaves_before_its_prefill_the_samples_prefill_it_themselves(
    sensitive_model, tiny_tokenizer
) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, max_prefill_tokens=8)
    requests = engine.prepare_samples(PROMPT, [(f"r-{n}", _sampled(80 + n)) for n in range(3)])
    for request in requests:
        engine.enqueue(request)
    engine.step()
    requests[0].cancel()  # mid-prefill: its keys are half there
    done = _finish(engine)
    assert [done[id(r)][0] for r in requests] == ["cancelled", "length", "length"]
    for n in (1, 2):
        assert done[id(requests[n])][1] == _alone(sensitive_model, tiny_tokenizer, _sampled(80 + n))
    assert engine.pool.free_slots == 8


def test_when_the_prompts_request_is_cancelled_while_waiting_the_samples_still_run(
    sensitive_model, tiny_tokenizer
) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer)
    requests = engine.prepare_samples(PROMPT, [(f"r-{n}", _sampled(90 + n)) for n in range(3)])
    requests[0].cancel()
    done = _run(engine, requests)
    assert done[id(requests[0])] == ()
    assert done[id(requests[2])] == _alone(sensitive_model, tiny_tokenizer, _sampled(92))
    assert engine.pool.free_slots == 8


def test_more_samples_than_slots_is_refused_naming_n(sensitive_model, tiny_tokenizer) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, max_batch=4)
    with pytest.raises(RequestError, match="bundle.max_batch") as refused:
        engine.prepare_samples(PROMPT, [(f"r-{n}", _sampled(n)) for n in range(5)])
    assert refused.value.field == "n"
    assert not engine.has_work


def test_samples_reuse_a_cached_prefix_once(sensitive_model, tiny_tokenizer) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, prefix=1024)
    engine.generate([PROMPT], SamplingParams(max_new_tokens=1, ignore_eos=True))
    requests = engine.prepare_samples(PROMPT, [(f"r-{n}", _sampled(n)) for n in range(3)])
    done = _run(engine, requests)
    assert engine.prefix_cache.stats.hit == 16  # the prompt's one full block, for the first sample only
    assert done[id(requests[1])] == _alone(sensitive_model, tiny_tokenizer, _sampled(1))


def test_a_step_failing_mid_prefill_fails_the_samples_waiting_for_it(
    sensitive_model, tiny_tokenizer, monkeypatch
) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer, max_prefill_tokens=8)
    requests = engine.prepare_samples(PROMPT, [(f"r-{n}", _sampled(n)) for n in range(3)])
    for request in requests:
        engine.enqueue(request)
    engine.step()  # the first chunk of 8 of 30

    def broken(plan):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.runner, "run", broken)
    failed = {id(request): output.finish_reason for request, output in engine.step()}
    assert [failed.get(id(r)) for r in requests] == ["error"] * 3  # no sample prefills it again alone
    assert not engine.has_work and engine.pool.free_slots == 8
    assert engine.last_step is not None and engine.last_step.prefill_tokens == 0


def test_an_empty_step_reports_no_step(sensitive_model, tiny_tokenizer) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer)
    engine.generate([PROMPT], SamplingParams(max_new_tokens=1))
    assert engine.last_step is not None
    request = engine.prepare("gone", PROMPT, SamplingParams(max_new_tokens=1))
    request.cancel()
    engine.enqueue(request)
    engine.step()  # it leaves at once: nothing ran, so on_step must not see the last step again
    assert engine.last_step is None


def test_samples_with_logprobs_share_their_first_distribution(sensitive_model, tiny_tokenizer) -> None:
    engine = _engine(sensitive_model, tiny_tokenizer)
    params = [SamplingParams(max_new_tokens=4, temperature=1.0, seed=s, ignore_eos=True, logprobs=3) for s in (1, 2)]
    requests = engine.prepare_samples(PROMPT, [(f"r-{s}", p) for s, p in enumerate(params)])
    _run(engine, requests)
    first, second = (r.logprobs for r in requests)
    assert len(first) == len(second) == 4
    assert first[0].top == second[0].top  # the same prompt's logits, prefilled once
    assert [e.token for e in second] == list(requests[1].output_ids)
