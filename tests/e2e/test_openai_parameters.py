"""The OpenAI parameters beyond the basics, through a real `aieng serve` and the official openai
client: token-id prompts, models.retrieve, a prompt list the queue could never hold (a 400
that leaves no sequence behind, not a 429 no retry can pass), and the reason of every
refusal in the request's log line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.serve_helpers import Server, poll, serving

pytestmark = pytest.mark.e2e

MAX_WAITING = 32  # the tiny config's serving.max_waiting
FINISH_REASONS = ("stop", "length", "cancelled", "timeout", "error")


@pytest.fixture(scope="module")
def prompts(bundle_path: Path) -> list[dict[str, Any]]:
    golden = json.loads((bundle_path / "golden.json").read_text(encoding="utf-8"))["outputs"]
    return [entry for entry in golden if "messages" not in entry]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, bundle_path: Path) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("openai-parameters"), bundle_path) as running:
        yield running


def finished(server: Server) -> float:
    return sum(server.metric("aieng_request_success_total", finished_reason=r) for r in FINISH_REASONS)


def test_token_id_prompts_answer_as_their_text(server: Server, prompts: list[dict[str, Any]]) -> None:
    client = server.client()
    for golden in prompts:
        by_text = client.completions.create(model="aieng", prompt=golden["prompt"], max_tokens=8, temperature=0)
        by_ids = client.completions.create(model="aieng", prompt=golden["prompt_ids"], max_tokens=8, temperature=0)
        assert by_ids.choices[0].text == by_text.choices[0].text == golden["text"]
        assert by_ids.usage.prompt_tokens == len(golden["prompt_ids"])
    several = client.completions.create(
        model="aieng", prompt=[g["prompt_ids"] for g in prompts], max_tokens=8, temperature=0
    )
    assert [c.index for c in several.choices] == list(range(len(prompts)))
    assert [c.text for c in several.choices] == [g["text"] for g in prompts]


@pytest.mark.parametrize(
    ("prompt", "says"),
    [
        ([10**9], "token ids must be in [0, "),
        ([-1], "prompt"),
        ([[1, 2], []], "prompt"),
        ([True, 2], "prompt"),
    ],
    ids=["beyond-the-vocabulary", "negative", "an-empty-list", "a-boolean"],
)
def test_bad_token_id_prompts_are_400(server: Server, prompt: list, says: str) -> None:
    reply = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert reply.status == 400, reply.body
    assert reply.error["param"] == "prompt" and says in reply.error["message"]


def test_models_retrieve(server: Server, serving_bundle_artifact) -> None:
    client = server.client()
    bundle_id = serving_bundle_artifact.bundle.id
    card = client.models.retrieve(bundle_id)
    assert (card.id, card.object, card.owned_by) == (bundle_id, "model", "aieng")
    assert client.models.retrieve("aieng").id == "aieng"
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("gpt-4o")
    assert raised.value.body["code"] == "model_not_found"


def test_a_prompt_list_the_queue_can_never_hold_is_a_400_leaving_nothing_behind(server: Server) -> None:
    before = finished(server)
    too_many = server.post("/v1/completions", {"prompt": ["The data"] * (MAX_WAITING + 8), "max_tokens": 2})
    assert (too_many.status, too_many.error["param"]) == (400, "prompt"), too_many.body
    assert f"serving.max_waiting {MAX_WAITING}" in too_many.error["message"]
    assert "retry-after" not in too_many.headers
    predict = server.post("/predict", {"inputs": ["The data"] * (MAX_WAITING + 1), "options": {"max_new_tokens": 2}})
    assert (predict.status, predict.error["param"]) == (400, "inputs"), predict.body
    # A refused list queued nothing: no sequence was started, so none was counted as cancelled.
    assert finished(server) == before
    assert server.metric("aieng_num_requests_waiting") == 0
    # As many as the queue holds are answered, every one.
    full = server.post("/v1/completions", {"prompt": ["The data"] * MAX_WAITING, "max_tokens": 2})
    assert full.status == 200 and len(full.json["choices"]) == MAX_WAITING
    poll(lambda: finished(server) == before + MAX_WAITING, 30, "the full list to be counted")


def test_a_list_with_one_bad_prompt_queues_none_of_them(server: Server) -> None:
    before = finished(server)
    reply = server.post("/v1/completions", {"prompt": ["The data", "pipeline " * 80], "max_tokens": 2})
    assert reply.status == 400 and "max_context" in reply.error["message"], reply.body
    assert finished(server) == before


def test_every_refusal_is_logged_with_its_reason(server: Server) -> None:
    refusals = [
        ("/v1/completions", {"prompt": "a", "n": 0}, 400),
        ("/v1/completions", {"prompt": "a", "model": "gpt-4o"}, 404),
        ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400),
        ("/generate", {"prompt": "a", "bogus": 1}, 400),
    ]
    for index, (path, body, status) in enumerate(refusals):
        reply = server.post(path, body, headers={"X-Request-ID": f"refused-{index}"})
        assert reply.status == status, reply.body
    nope = server.get("/nope")
    assert nope.status == 404

    def logged() -> dict[str, dict[str, Any]] | None:
        """The access log line of each refusal, once all are written (None before)."""
        found = {
            line["request_id"]: line
            for line in server.log_lines()
            if str(line.get("request_id", "")).startswith("refused-") and "status" in line
        }
        return found if len(found) == len(refusals) else None

    lines = poll(logged, 10, "the access log lines")
    for index, (path, _, status) in enumerate(refusals):
        line = lines[f"refused-{index}"]
        assert (line["path"], line["status"]) == (path, status)
        assert line["error"] == server.post(path, refusals[index][1]).error["message"]
    assert any(line.get("path") == "/nope" and "Not Found" in line.get("error", "") for line in server.log_lines())


def test_logit_bias_and_penalties_through_the_openai_client(
    server: Server, prompts: list[dict[str, Any]], bundle_path: Path
) -> None:
    from aieng_core.tokenizer.bpe import load_tokenizer

    client = server.client()
    tokenizer = load_tokenizer(bundle_path)
    [forced] = tokenizer.encode("x", add_special_tokens=False).ids
    # +100 on one token: greedy picks it at every step, in completions and in chat alike.
    biased = client.completions.create(
        model="aieng",
        prompt=prompts[0]["prompt"],
        max_tokens=5,
        temperature=0,
        logit_bias={str(forced): 100},
        extra_body={"ignore_eos": True},
    )
    assert biased.choices[0].text == "x" * 5
    chat = client.chat.completions.create(
        model="aieng",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        temperature=0,
        logit_bias={str(forced): 100},
        extra_body={"ignore_eos": True},
    )
    assert chat.choices[0].message.content == "x" * 4
    # Penalties as large as OpenAI allows change what a repetitive greedy run says.
    kwargs: dict[str, Any] = {"model": "aieng", "prompt": prompts[0]["prompt"], "max_tokens": 16, "temperature": 0}
    plain = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    penalized = client.completions.create(
        **kwargs, frequency_penalty=2.0, presence_penalty=2.0, extra_body={"ignore_eos": True}
    )
    assert penalized.choices[0].text != plain.choices[0].text
    out_of_vocabulary = server.post("/v1/completions", {"prompt": "a", "max_tokens": 2, "logit_bias": {"99999": 5}})
    assert (out_of_vocabulary.status, out_of_vocabulary.error["param"]) == (400, "logit_bias")


def test_echo_puts_each_prompt_before_its_choice(server: Server, prompts: list[dict[str, Any]]) -> None:
    client = server.client()
    texts = [g["prompt"] for g in prompts]
    kwargs: dict[str, Any] = {"model": "aieng", "max_tokens": 8, "temperature": 0}
    whole = client.completions.create(prompt=texts, echo=True, **kwargs)
    assert [c.text for c in whole.choices] == [g["prompt"] + g["text"] for g in prompts]
    assert whole.usage.prompt_tokens == sum(len(g["prompt_ids"]) for g in prompts)
    streamed = list(client.completions.create(prompt=texts, echo=True, stream=True, **kwargs))
    joined = ["".join(c.choices[0].text for c in streamed if c.choices[0].index == i) for i in range(len(prompts))]
    assert joined == [c.text for c in whole.choices]
    # Token-id prompts are echoed as the bundle's tokenizer decodes them.
    by_ids = client.completions.create(prompt=prompts[0]["prompt_ids"], echo=True, **kwargs)
    assert by_ids.choices[0].text == prompts[0]["prompt"] + prompts[0]["text"]


def test_n_samples_are_each_the_answer_of_their_seed_alone(server: Server, prompts: list[dict[str, Any]]) -> None:
    client = server.client()
    texts = [g["prompt"] for g in prompts[:2]]
    kwargs: dict[str, Any] = {"model": "aieng", "max_tokens": 8, "temperature": 1.0, "extra_body": {"ignore_eos": True}}
    alone = [
        [client.completions.create(prompt=text, seed=100 + s, **kwargs).choices[0].text for s in range(3)]
        for text in texts
    ]
    assert all(len(set(samples)) > 1 for samples in alone)  # the seeds give different samples
    # n = 3 of two prompts: choice prompt * 3 + sample, sample s drawn from seed + s (vLLM's rule).
    several = client.completions.create(prompt=texts, n=3, seed=100, **kwargs)
    assert [c.index for c in several.choices] == list(range(6))
    assert [c.text for c in several.choices] == [text for samples in alone for text in samples]
    assert several.usage.prompt_tokens == sum(len(g["prompt_ids"]) for g in prompts[:2])  # each prompt once
    assert several.usage.completion_tokens == 6 * 8
    streamed = list(client.completions.create(prompt=texts, n=3, seed=100, stream=True, **kwargs))
    joined = ["".join(c.choices[0].text for c in streamed if c.choices[0].index == i) for i in range(6)]
    assert joined == [c.text for c in several.choices]
    # Echoed, each sample starts with its own prompt.
    echoed = client.completions.create(prompt=texts, n=2, seed=100, echo=True, **kwargs)
    assert [c.text for c in echoed.choices] == [texts[i // 2] + alone[i // 2][i % 2] for i in range(4)]


def test_n_chat_samples_streamed_and_not(server: Server) -> None:
    client = server.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a pipeline?"}]
    kwargs: dict[str, Any] = {"model": "aieng", "messages": messages, "max_tokens": 6, "temperature": 1.0, "seed": 7}
    kwargs["extra_body"] = {"ignore_eos": True}
    alone = [client.chat.completions.create(**{**kwargs, "seed": 7 + s}).choices[0].message.content for s in range(2)]
    whole = client.chat.completions.create(n=2, **kwargs)
    assert [c.message.content for c in whole.choices] == alone
    streamed = list(client.chat.completions.create(n=2, stream=True, stream_options={"include_usage": True}, **kwargs))
    roles = [c.choices[0].index for c in streamed if c.choices and c.choices[0].delta.role == "assistant"]
    assert roles == [0, 1]  # each choice opens with its role
    joined = ["".join(c.choices[0].delta.content or "" for c in streamed if c.choices and c.choices[0].index == i)
              for i in range(2)]  # fmt: skip
    assert joined == alone
    assert streamed[-1].usage is not None
    assert (streamed[-1].usage.prompt_tokens, streamed[-1].usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        12,
    )


def test_n_beyond_the_slots_or_the_queue_is_a_400_naming_the_limit(server: Server) -> None:
    before = finished(server)
    slots = server.post("/v1/completions", {"prompt": "a", "n": 17, "max_tokens": 2})
    assert (slots.status, slots.error["param"]) == (400, "n"), slots.body
    assert "bundle.max_batch" in slots.error["message"] and "16" in slots.error["message"]
    queue = server.post("/v1/completions", {"prompt": ["a"] * 3, "n": 11, "max_tokens": 2})
    assert (queue.status, queue.error["param"]) == (400, "n"), queue.body
    assert f"serving.max_waiting {MAX_WAITING}" in queue.error["message"]
    assert finished(server) == before  # nothing was queued


def test_completion_logprobs_streamed_and_not(server: Server, prompts: list[dict[str, Any]], bundle_path: Path) -> None:
    from aieng_core.tokenizer.bpe import load_tokenizer

    specials = {t.content for t in load_tokenizer(bundle_path).get_added_tokens_decoder().values() if t.special}
    client = server.client()
    for golden in prompts:  # ASCII and Chinese (tokens holding parts of a character) alike
        kwargs: dict[str, Any] = {"model": "aieng", "prompt": golden["prompt"], "max_tokens": 8, "temperature": 0}
        whole = client.completions.create(logprobs=3, **kwargs)
        choice = whole.choices[0]
        lp = choice.logprobs
        assert choice.text == golden["text"]
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == whole.usage.completion_tokens
        for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
            assert value <= 0 and token in top and len(top) <= 4
            assert top[token] == value == max(top.values())  # greedy: the chosen token is the most likely
        # Offsets index the text: each token's text starts where its offset says.
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        for token, start in zip(lp.tokens, lp.text_offset, strict=True):
            if token in specials:  # EOS: named, adds nothing, at the end
                assert start == len(choice.text)
            elif "\ufffd" not in token:  # (a token holding part of a character is no substring)
                assert choice.text[start : start + len(token)] == token
        assert any(token not in specials and "\ufffd" not in token for token in lp.tokens)
        streamed = list(client.completions.create(logprobs=3, stream=True, **kwargs))
        pieces = [c.choices[0].logprobs for c in streamed if c.choices[0].logprobs is not None]
        assert [t for p in pieces for t in p.tokens] == lp.tokens
        assert [v for p in pieces for v in p.token_logprobs] == lp.token_logprobs
        assert [o for p in pieces for o in p.text_offset] == lp.text_offset
    only_chosen = client.completions.create(model="aieng", prompt="The data", max_tokens=3, temperature=0, logprobs=0)
    assert [len(top) for top in only_chosen.choices[0].logprobs.top_logprobs] == [1, 1, 1]
    plain = client.completions.create(model="aieng", prompt="The data", max_tokens=3, temperature=0)
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_streamed_and_not(server: Server) -> None:
    client = server.client()
    kwargs: dict[str, Any] = {
        "model": "aieng",
        "messages": [{"role": "user", "content": "数据清洗?"}],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = client.chat.completions.create(**kwargs)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    text = whole.choices[0].message.content
    # The bytes of the tokens are the reply, exactly (EOS, a special token, brings none).
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8") == text
    for entry in content:
        assert [t.token for t in entry.top_logprobs][0] == entry.token and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == entry.logprob
    streamed = list(client.chat.completions.create(stream=True, **kwargs))
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in entries] == [(e.token, e.logprob) for e in content]
    no_top = client.chat.completions.create(**{**kwargs, "top_logprobs": None})
    assert all(e.top_logprobs == [] for e in no_top.choices[0].logprobs.content)
