"""The engine loop on the tiny trained model: batching never changes a result, requests join
and leave at step boundaries, stops and limits, cancellation, and the threaded loop."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from aieng_core.model.llama import LlamaForCausalLM
from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.serving.engine_loop import EngineLoop, EngineStopped
from aieng_core.serving.request import RequestError, SamplingParams
from aieng_core.serving.scheduler import QueueFull

PROMPTS = [
    "The data pipeline",
    "数据清洗",
    "A model is trained on clean text and",
    "Once",
    "The tokenizer splits every byte of the text into merges, then",
    "rollback",
    "模型",
    "Every partition is hashed",
]


def _mixed_prompts(engine, count: int) -> list[list[int]]:
    """`count` prompts of mixed lengths (1 to ~30 tokens)."""
    ids = [engine.encode(p) for p in PROMPTS]
    return [(ids[n % len(ids)] * 3)[: 1 + (n * 7) % 30] for n in range(count)]


def test_greedy_batch_of_16_equals_generate_greedy_one_prompt_at_a_time(make_engine, tiny_model) -> None:
    engine = make_engine(max_batch=16)
    prompts = _mixed_prompts(engine, 16)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    assert [o.finish_reason for o in outputs] == ["length"] * 16
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = tiny_model.generate_greedy(torch.tensor([prompt]), 20)[0, len(prompt) :].tolist()
        assert list(output.token_ids) == expected
    assert engine.pool.free_slots == 16


def test_decode_rows_go_back_to_their_requests_when_slots_are_reused_out_of_order(tiny_model, tiny_tokenizer) -> None:
    # A randomly initialised model of the tiny shape: its greedy continuation of each of these
    # prompts is a token of its own (the trained one answers most prompts with the same blank
    # line), so a token handed to the wrong request changes that request's output.
    torch.manual_seed(5)
    model = LlamaForCausalLM(tiny_model.config).eval()
    engine = Engine(model, tiny_tokenizer, EngineLimits(4, 64, 64, 512), tiny_model.config.eos_token_id)
    prompts = [engine.encode(p) for p in PROMPTS]
    new_tokens = [9, 2, 12, 5, 7, 3, 10, 4]  # distinct, so requests finish at different steps
    expected = [model.generate_greedy(torch.tensor([p]), n)[0, len(p) :].tolist() for p, n in zip(prompts, new_tokens)]
    assert len({tuple(e[:2]) for e in expected}) == len(expected)  # no two requests could swap unseen

    decode_slots: list[list[int]] = []
    real_run = engine.runner.run

    def recording_run(plan):
        decode_slots.append([r.slot for r in plan.decode])
        return real_run(plan)

    engine.runner.run = recording_run
    # Four at once, then the rest as earlier ones finish: a newcomer takes the lowest free
    # slot, below requests admitted before it, so decode order (admission) is not slot order.
    arrivals = {0: [0, 1, 2, 3], 2: [4], 5: [5, 6], 7: [7]}
    finals = {}
    step = 0
    while step <= max(arrivals) or engine.has_work:
        for n in arrivals.get(step, []):
            params = SamplingParams(max_new_tokens=new_tokens[n], ignore_eos=True)
            engine.add_request(f"r{n}", prompts[n], params)
        for request, output in engine.step():
            if output.finished:
                finals[request.request_id] = output
        step += 1

    assert any(slots != sorted(slots) for slots in decode_slots), decode_slots
    assert any(len(slots) < max(slots, default=-1) + 1 for slots in decode_slots), decode_slots  # idle rows too
    for n, tokens in enumerate(expected):
        assert finals[f"r{n}"].finish_reason == "length"
        assert list(finals[f"r{n}"].token_ids) == tokens, f"request r{n}"
    assert engine.pool.free_slots == 4


@pytest.mark.parametrize("batch", [1, 16])
def test_greedy_engine_equals_transformers_generate_with_its_cache(make_engine, trained_home, batch) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(trained_home.model.path).eval()
    reference.generation_config.eos_token_id = None  # ignore EOS, as ignore_eos does
    engine = make_engine(max_batch=16)
    prompts = _mixed_prompts(engine, batch)
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=24, ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = reference.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, use_cache=True, pad_token_id=1
        )[0, len(prompt) :].tolist()
        assert list(output.token_ids) == expected


def test_a_request_joins_at_the_next_step_and_a_finished_one_frees_its_slot_at_once(make_engine) -> None:
    engine = make_engine(max_batch=4)
    long = engine.add_request("long", "The data pipeline", SamplingParams(max_new_tokens=12, ignore_eos=True))
    engine.step()
    engine.step()
    assert len(long.output_ids) == 2
    short = engine.add_request("short", "Once", SamplingParams(max_new_tokens=2, ignore_eos=True))
    progressed = {request.request_id for request, _ in engine.step()}
    assert progressed == {"long", "short"}  # the newcomer's prefill ran beside the running decode
    assert len(long.output_ids) == 3 and len(short.output_ids) == 1
    assert engine.pool.free_slots == 2
    finished = [output for request, output in engine.step() if output.finished]
    assert [o.request_id for o in finished] == ["short"] and finished[0].finish_reason == "length"
    assert engine.pool.free_slots == 3  # freed in the step that finished it
    while engine.has_work:
        engine.step()
    assert len(long.output_ids) == 12 and engine.pool.free_slots == 4


def test_a_long_queue_never_starves_the_running_decodes(make_engine) -> None:
    # A prefill budget of one prompt per step, four slots, twelve requests.
    engine = make_engine(max_batch=4, max_prefill_tokens=1)
    requests = [
        engine.add_request(f"r{n}", "The data pipeline", SamplingParams(max_new_tokens=6, ignore_eos=True))
        for n in range(12)
    ]
    while engine.has_work:
        before = {id(r): len(r.output_ids) for r in engine.scheduler.running if r.output_ids}
        engine.step()
        for request in requests:
            if id(request) in before:
                assert len(request.output_ids) == before[id(request)] + 1
    assert all(len(r.output_ids) == 6 for r in requests)


def test_a_stop_string_ends_the_text_before_it(make_engine) -> None:
    engine = make_engine()
    # Seeded sampling gives varied text (the tiny model's greedy text is mostly blank lines);
    # the same seed replays it exactly up to the stop string.
    params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=3, ignore_eos=True)
    [free] = engine.generate(["The data pipeline"], params)
    # A stop string from the middle of the free text: two characters that are not blank.
    start = next(n for n in range(3, len(free.text) - 2) if free.text[n : n + 2].strip() == free.text[n : n + 2])
    stop = free.text[start : start + 2]
    [stopped] = engine.generate(["The data pipeline"], SamplingParams(**{**params.__dict__, "stop": (stop,)}))
    assert stopped.finish_reason == "stop"
    assert stopped.text == free.text[: free.text.index(stop)]


def test_eos_stops_a_request_unless_ignore_eos(make_engine, tiny_model, tiny_tokenizer) -> None:
    from aieng_core.serving.engine import Engine

    engine = make_engine()
    [free] = engine.generate(["Once"], SamplingParams(max_new_tokens=10, ignore_eos=True))
    # Declare the fourth generated token the end of sequence: generation must stop right there.
    eos = free.token_ids[3]
    first = free.token_ids.index(eos)
    stopping = Engine(tiny_model, tiny_tokenizer, engine.limits, eos_token_id=eos)
    [stopped] = stopping.generate(["Once"], SamplingParams(max_new_tokens=10))
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: first + 1]
    [running_on] = stopping.generate(["Once"], SamplingParams(max_new_tokens=10, ignore_eos=True))
    assert running_on.finish_reason == "length" and running_on.token_ids == free.token_ids


def test_prompt_plus_max_new_tokens_beyond_max_context_is_refused_not_truncated(make_engine) -> None:
    engine = make_engine(max_context=64)
    prompt = engine.encode("The data pipeline")
    with pytest.raises(RequestError, match=r"exceeds max_context \(64\)") as refused:
        engine.add_request("r", prompt, SamplingParams(max_new_tokens=64 - len(prompt) + 1))
    assert refused.value.field == "max_new_tokens"
    engine.add_request("ok", prompt, SamplingParams(max_new_tokens=64 - len(prompt)))
    with pytest.raises(RequestError) as empty:
        engine.add_request("e", "", SamplingParams(max_new_tokens=1))
    assert empty.value.field == "prompt"


# Two-, three- and four-byte characters and a zero-width joiner: the tiny tokenizer cuts most of
# them into one token per byte (and one of its merges, b"\xe2\x80", ends inside a character).
MULTIBYTE_TEXTS = {"zh": "数据清洗，模型训练。", "emoji": "naïve café 😀🎉 👩\u200d💻 über"}


def whole_characters_by_token(tokenizer, ids: list[int]) -> list[str]:
    """What each token completes: the text of the whole characters its bytes end, decoded by
    the tokenizer itself (a prefix ending inside a character decodes to trailing U+FFFD)."""
    pieces, emitted = [], ""
    for n in range(1, len(ids) + 1):
        complete = tokenizer.decode(ids[:n]).rstrip("\ufffd")
        pieces.append(complete[len(emitted) :])
        emitted = complete
    return pieces


def test_streamed_text_equals_the_final_text_and_never_splits_a_character(make_engine, monkeypatch) -> None:
    engine = make_engine()
    scripts = {name: engine.encode(text) for name, text in MULTIBYTE_TEXTS.items()}
    # The tiny model never writes such text by itself: each step runs the real forward and
    # sampling, then hands each request the next token of its script instead.
    real_run = engine.runner.run

    def scripted_run(plan):
        result = real_run(plan)
        forced = tuple(scripts[r.request_id][len(r.output_ids)] for r in (*plan.prefill, *plan.decode))
        return dataclasses.replace(result, tokens=forced)

    monkeypatch.setattr(engine.runner, "run", scripted_run)
    for name, ids in scripts.items():
        engine.add_request(name, "数据清洗", SamplingParams(max_new_tokens=len(ids), ignore_eos=True))
    pieces: dict[str, list[str]] = {name: [] for name in scripts}
    finals = {}
    while engine.has_work:
        for request, output in engine.step():
            pieces[request.request_id].append(output.new_text)
            if output.finished:
                finals[request.request_id] = output

    for name, text in MULTIBYTE_TEXTS.items():
        ids, streamed, final = scripts[name], pieces[name], finals[name]
        assert final.finish_reason == "length" and list(final.token_ids) == ids
        expected = whole_characters_by_token(engine.tokenizer, ids)
        assert "".join(expected) == text
        # The case in question: tokens that end inside a character, so their step emits nothing yet.
        assert expected.count("") >= 5, expected
        # Each step streams exactly the characters its token completed, never part of one.
        assert streamed == expected
        assert not any("\ufffd" in piece for piece in streamed)
        assert "".join(streamed) == final.text == text


def test_a_seeded_sampled_request_is_reproducible_whatever_shares_its_batch(make_engine) -> None:
    engine = make_engine()
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_k=50, top_p=0.9, seed=7, ignore_eos=True)
    [alone] = engine.generate(["The data pipeline"], params)
    others = [SamplingParams(max_new_tokens=n, temperature=1.3, seed=None, ignore_eos=True) for n in (5, 30, 12)]
    batch = engine.generate(["Once", "The data pipeline", "数据清洗", "The data pipeline"], [*others, params])
    assert batch[-1].token_ids == alone.token_ids
    [other_seed] = engine.generate(["The data pipeline"], SamplingParams(**{**params.__dict__, "seed": 8}))
    assert other_seed.token_ids != alone.token_ids


def test_a_cancelled_request_leaves_at_the_next_step_with_its_slot_freed(make_engine) -> None:
    engine = make_engine(max_batch=2)
    a = engine.add_request("a", "Once", SamplingParams(max_new_tokens=30, ignore_eos=True))
    b = engine.add_request("b", "Once", SamplingParams(max_new_tokens=30, ignore_eos=True))
    engine.step()
    assert engine.pool.free_slots == 0
    a.cancel()
    outputs = dict((r.request_id, o) for r, o in engine.step())
    assert outputs["a"].finished and outputs["a"].finish_reason == "cancelled"
    assert engine.pool.free_slots == 1 and not b.finished


def test_a_failing_step_fails_only_its_requests_and_the_engine_goes_on(make_engine, monkeypatch) -> None:
    engine = make_engine()
    real_run = engine.runner.run
    calls = {"n": 0}

    def fail_once(plan):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return real_run(plan)

    monkeypatch.setattr(engine.runner, "run", fail_once)
    failed = engine.add_request("x", "Once", SamplingParams(max_new_tokens=4))
    [(_, output)] = engine.step()
    assert output.finish_reason == "error" and failed.finished and engine.pool.free_slots == 16
    [after] = engine.generate(["Once"], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert after.finish_reason == "length"


def test_the_engine_loop_refuses_beyond_the_queue_and_serves_requests_from_threads(make_engine) -> None:
    engine = make_engine(max_batch=2, max_waiting=2)
    loop = EngineLoop(engine)  # not started yet: nothing leaves the queue
    outputs: dict[str, list] = {}
    all_done = threading.Event()
    names = ["r0", "r1", "t0", "t1", "t2", "t3"]

    def sink_for(name: str):
        def sink(output) -> None:
            outputs.setdefault(name, []).append(output)
            if all(outputs.get(n) and outputs[n][-1].finished for n in names):
                all_done.set()

        return sink

    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    loop.submit("r0", "The data pipeline", params, sink_for("r0"))
    loop.submit("r1", "数据清洗", params, sink_for("r1"))
    with pytest.raises(QueueFull, match="2 requests"):
        loop.submit("over", "Once", params, sink_for("over"))
    loop.start()
    try:

        def client(name: str) -> None:
            while True:  # shed load is retried, as an HTTP client retries a 429
                try:
                    loop.submit(name, "Once", params, sink_for(name))
                    return
                except QueueFull:
                    all_done.wait(0.005)

        threads = [threading.Thread(target=client, args=(name,)) for name in names[2:]]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert all_done.wait(60), "the loop did not finish the accepted requests"
    finally:
        loop.stop()
    assert "over" not in outputs
    for name in names:
        final = outputs[name][-1]
        assert final.finish_reason == "length" and len(final.token_ids) == 8
        assert "".join(o.new_text for o in outputs[name]) == final.text
    assert not loop.running and engine.pool.free_slots == 2


def test_stopping_the_loop_finishes_every_request_in_flight_as_cancelled(make_engine) -> None:
    engine = make_engine(max_batch=1, max_waiting=4)
    loop = EngineLoop(engine)
    finals: dict[str, object] = {}
    for n in range(3):
        loop.submit(
            f"r{n}",
            "Once",
            SamplingParams(max_new_tokens=40, ignore_eos=True),
            lambda o, n=n: finals.__setitem__(f"r{n}", o) if o.finished else None,
        )
    loop.start()
    loop.stop()
    assert sorted(finals) == ["r0", "r1", "r2"]
    assert {o.finish_reason for o in finals.values()} <= {"cancelled", "length"}
    assert engine.pool.free_slots == 1 and not engine.has_work


def test_a_vanishing_temperature_samples_greedily_instead_of_overflowing(make_engine) -> None:
    engine = make_engine()
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    [expected] = engine.generate(["The data pipeline"], greedy)
    tiny = SamplingParams(max_new_tokens=12, temperature=1e-40, top_k=5, ignore_eos=True)
    [got] = engine.generate(["The data pipeline"], tiny)
    assert got.finish_reason == "length" and got.token_ids == expected.token_ids


def test_a_row_the_sampler_cannot_draw_fails_only_its_own_request(make_engine, monkeypatch) -> None:
    from aieng_core.serving import sampling

    real = sampling.scaled_rows

    def nan_for_seed_13(logits, params):
        scaled = real(logits, params)
        for row, p in enumerate(params):
            if p.seed == 13:
                scaled[row] = float("nan")  # what a numerically broken row looks like
        return scaled

    monkeypatch.setattr(sampling, "scaled_rows", nan_for_seed_13)
    engine = make_engine()
    bad = SamplingParams(max_new_tokens=8, temperature=1.0, seed=13, ignore_eos=True)
    good = SamplingParams(max_new_tokens=8, temperature=1.0, seed=14, ignore_eos=True)
    outputs = engine.generate(["Once", "Once", "数据清洗"], [good, bad, SamplingParams(max_new_tokens=8)])
    assert [o.finish_reason for o in outputs] == ["length", "error", "length"]
    assert engine.pool.free_slots == 16


def test_an_engine_loop_that_fails_fails_its_requests_and_refuses_new_ones(make_engine, monkeypatch) -> None:
    engine = make_engine()

    def broken_step():
        raise KeyError("injected fault outside the model step")

    monkeypatch.setattr(engine, "step", broken_step)
    loop = EngineLoop(engine)
    finals = []
    done = threading.Event()
    loop.submit("a", "Once", SamplingParams(max_new_tokens=4), lambda o: (finals.append(o), done.set()))
    loop.start()
    assert done.wait(30), "a request of a failed loop was left waiting"
    assert [o.finish_reason for o in finals] == ["error"] and finals[0].finished
    loop._thread.join(30)
    assert not loop.running
    with pytest.raises(EngineStopped, match="the engine loop is stopped"):
        loop.submit("b", "Once", SamplingParams(max_new_tokens=4), lambda o: None)


def test_a_long_prompt_is_prefilled_in_chunks_while_every_stream_keeps_decoding(make_engine, tiny_model) -> None:
    """max_prefill_tokens 8: a 40-token prompt arriving beside 4 running streams is prefilled
    in 5 chunks of 8, one per step; every stream gets a token every one of those steps, and
    the long prompt's output is the one its whole prefill gives."""
    engine = make_engine(max_batch=8, max_prefill_tokens=8)
    streams = [
        engine.add_request(f"s{n}", [5 + n, 9], SamplingParams(max_new_tokens=30, ignore_eos=True)) for n in range(4)
    ]
    engine.step()  # the 4 two-token prompts fit one step's budget
    assert all(len(s.output_ids) == 1 for s in streams)
    long_prompt = (engine.encode(" ".join(PROMPTS)) * 3)[:40]
    assert len(long_prompt) == 40
    long = engine.add_request("long", long_prompt, SamplingParams(max_new_tokens=10, ignore_eos=True))
    prefill_steps = []
    while not long.output_ids:
        before = [len(s.output_ids) for s in streams]
        engine.step()
        prefill_steps.append(list(engine.last_step.prefill_chunks))
        assert [len(s.output_ids) for s in streams] == [n + 1 for n in before]  # nobody waited
    assert prefill_steps == [[8]] * 5
    while engine.has_work:
        engine.step()
    expected = tiny_model.generate_greedy(torch.tensor([long_prompt]), 10)[0, 40:].tolist()
    assert long.output_ids == expected


def test_logprobs_are_those_of_the_transformers_model_for_the_same_tokens(make_engine, trained_home) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(trained_home.model.path).eval()
    engine = make_engine(max_batch=4)
    prompts = _mixed_prompts(engine, 3)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=9, ignore_eos=True, logprobs=2)
    for prompt, output in zip(prompts, engine.generate(prompts, params), strict=True):
        assert [e.token for e in output.logprobs] == list(output.token_ids)
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + list(output.token_ids)])).logits[0]
        expected = torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1 : -1]
        for step, entry in enumerate(output.logprobs):
            assert entry.logprob == pytest.approx(float(expected[step, entry.token]), abs=1e-4)
            assert [t for t, _ in entry.top] == torch.topk(expected[step], 2).indices.tolist()
