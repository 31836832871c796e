"""POST /v1/chat/completions through a real `aieng serve` and the official openai client: the
bundle's template renders the conversation (the golden conversations are the oracle: greedy
replies equal what the bundle recorded), streamed equals non-streamed, and bad input is a 400
naming what is wrong."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.serve_helpers import Server, poll, serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def conversations(bundle_path: Path) -> list[dict[str, Any]]:
    golden = json.loads((bundle_path / "golden.json").read_text(encoding="utf-8"))["outputs"]
    recorded = [entry for entry in golden if "messages" in entry]
    assert len(recorded) == 2
    return recorded


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, bundle_path: Path) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("chat"), bundle_path) as running:
        yield running


def test_greedy_chat_replies_are_the_recorded_golden_conversations(
    server: Server, conversations: list[dict[str, Any]], serving_bundle_artifact
) -> None:
    client = server.client()
    for golden in conversations:
        completion = client.chat.completions.create(
            model="aieng", messages=golden["messages"], max_tokens=golden["max_new_tokens"], temperature=0
        )
        assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
        assert completion.model == serving_bundle_artifact.bundle.id
        (choice,) = completion.choices
        assert (choice.index, choice.message.role) == (0, "assistant")
        assert choice.message.content == golden["text"]
        assert choice.finish_reason == golden["finish_reason"]
        assert completion.usage.prompt_tokens == len(golden["prompt_ids"])
        assert completion.usage.completion_tokens == len(golden["token_ids"])
        # max_completion_tokens is the same bound under OpenAI's newer name.
        newer = client.chat.completions.create(
            model="aieng", messages=golden["messages"], max_completion_tokens=golden["max_new_tokens"], temperature=0
        )
        assert newer.choices[0].message.content == golden["text"]


def test_streamed_chat_equals_non_streamed(server: Server, conversations: list[dict[str, Any]]) -> None:
    client = server.client()
    for golden in conversations:
        kwargs: dict[str, Any] = {"model": "aieng", "messages": golden["messages"], "max_tokens": 6, "temperature": 0}
        whole = client.chat.completions.create(**kwargs)
        chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
        assert {c.object for c in chunks} == {"chat.completion.chunk"}
        assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
        choice_chunks = [c for c in chunks if c.choices]
        assert "".join(c.choices[0].delta.content or "" for c in choice_chunks) == whole.choices[0].message.content
        reasons = [c.choices[0].finish_reason for c in choice_chunks]
        assert reasons[-1] == whole.choices[0].finish_reason and set(reasons[:-1]) == {None}
        assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_without_a_bound_the_reply_may_run_to_the_end_of_the_context(server: Server) -> None:
    messages = [{"role": "user", "content": "Tell me about the pipeline."}]
    reply = server.post("/v1/chat/completions", {"messages": messages, "ignore_eos": True, "temperature": 0})
    assert reply.status == 200, reply.body
    usage = reply.json["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 64  # the tiny bundle's max_context
    assert reply.json["choices"][0]["finish_reason"] == "length"
    assert reply.headers["x-aieng-bundle-id"] == reply.json["model"]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"messages": []}, "messages", "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "roles are system, user and assistant"),
        ({"messages": [{"role": "usr", "content": "x"}]}, "messages", "messages.0.role"),
        ({"messages": [{"role": "user"}]}, "messages", "messages.0.content: Field required"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages",
            "messages.0.content.0.type: Input should be 'text'",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n", "greater than or equal to 1"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs", "logprobs to be true"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools", "not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 500}, "max_completion_tokens", ""),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 500}, "max_tokens", "max_tokens"),
        ({"messages": [{"role": "user", "content": "pipeline " * 80}]}, "messages", "max_context"),
        ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4o"}, "model", "does not exist"),
    ],
    ids=[
        "no-messages",
        "role-the-template-refuses",
        "unknown-role",
        "no-content",
        "image-part",
        "n",
        "top-logprobs-without-logprobs",
        "tools",
        "max-completion-tokens",
        "max-tokens",
        "too-long",
        "model",
    ],
)
def test_bad_chat_requests_are_4xx_naming_the_problem(server: Server, body: dict, param: str, says: str) -> None:
    reply = server.post("/v1/chat/completions", body)
    assert reply.status in (400, 404), reply.body
    assert reply.error["param"] == param, reply.body
    assert says in reply.error["message"]
    assert "Traceback" not in reply.body.decode()


def test_the_openai_client_sees_a_refused_conversation_as_a_bad_request(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().chat.completions.create(model="aieng", messages=[{"role": "tool", "content": "x"}])
    assert raised.value.body["code"] == "chat_template_error"


def test_a_shared_system_prompt_is_reused_from_the_prefix_cache(server: Server, bundle_path: Path) -> None:
    from aieng_core.serving.chat_template import ChatTemplate
    from aieng_core.serving.prefix_cache import BLOCK_TOKENS
    from aieng_core.tokenizer.bpe import load_tokenizer

    template, tokenizer = ChatTemplate.of_directory(bundle_path), load_tokenizer(bundle_path)
    system = {"role": "system", "content": "Pipelines: answer briefly."}
    first, second = ([system, {"role": "user", "content": question}] for question in ("Why?", "数据?"))
    ids = {id(c): tokenizer.encode(template.render(c, True), add_special_tokens=False).ids for c in (first, second)}
    shared = next(n for n, (a, b) in enumerate(zip(ids[id(first)], ids[id(second)], strict=False)) if a != b)
    assert shared >= 2 * BLOCK_TOKENS  # the system prompt fills whole blocks
    client = server.client()

    def counted() -> tuple[float, float]:
        return server.metric("aieng_prefix_cache_queries_total"), server.metric("aieng_prefix_cache_hits_total")

    def ask(conversation: list[dict[str, str]], hits: int) -> str:
        """The greedy reply; the counters (taken after the step that admitted it) grow by its
        prompt and by `hits`."""
        queried, hit = counted()
        reply = client.chat.completions.create(model="aieng", messages=conversation, max_tokens=2, temperature=0)
        assert reply.usage.prompt_tokens == len(ids[id(conversation)])
        expected = (queried + len(ids[id(conversation)]), hit + hits)
        poll(lambda: counted() == expected, 10, f"prefix cache counters {expected}, at {counted()}")
        return reply.choices[0].message.content

    # This server never saw the system prompt (its other tests' conversations start otherwise).
    cold = ask(second, 0)
    ask(first, shared // BLOCK_TOKENS * BLOCK_TOKENS)  # the blocks it shares with the second
    again = ask(second, (len(ids[id(second)]) - 1) // BLOCK_TOKENS * BLOCK_TOKENS)  # all its own full blocks
    assert again == cold  # keys and values reused, the same reply
    queried, hit = counted()
    assert server.metric("aieng_prefix_cache_hit_rate") == pytest.approx(hit / queried)
    assert server.metric("aieng_prefix_cache_bytes") > 0 and server.metric("aieng_prefix_cache_blocks") > 0
