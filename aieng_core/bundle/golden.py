"""Golden outputs: greedy continuations recorded by the serving engine when a bundle is built
(serving/greedy.py), and replayed here when it is verified or loaded.

Golden conversations are goldens too: each is rendered through the bundle's chat template
(serving/chat_template.py) and its entry keeps the `messages` beside the rendered `prompt`;
a replay renders the messages again, and a template or renderer that no longer gives the
recorded prompt fails the golden as a changed tokenizer would.

They are recorded by the engine itself (not by the model's reference loop), so a replay
checks exactly what will serve: weights, tokenizer, cache, batching and detokenizer together.
Greedy decoding is deterministic for fixed kernels, but CPU reductions split their work by
thread count, so both recording and replay run on CPU with the thread count recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aieng_core.serving.chat_template import NO_CHAT_TEMPLATE, ChatTemplate, ChatTemplateError

if TYPE_CHECKING:
    from aieng_core.serving.engine import Engine

GOLDEN_DEVICE = "cpu"


def record_goldens(
    engine: Engine,
    prompts: Sequence[str],
    conversations: Sequence[Sequence[Mapping[str, str]]],
    chat: ChatTemplate,
    max_new_tokens: int,
) -> list[dict[str, Any]]:
    """The golden entries of a bundle: the prompts', then (with a template) the conversations',
    each conversation's entry with its `messages`."""
    from aieng_core.serving.greedy import greedy_continuations

    if chat.source is None:
        conversations = ()
    rendered = [chat.render(turns) for turns in conversations]
    entries = greedy_continuations(engine, [*prompts, *rendered], max_new_tokens)
    for entry, turns in zip(entries[len(prompts) :], conversations):
        entry["messages"] = [dict(turn) for turn in turns]
    return entries


def _rendered_again(entry: dict[str, Any], chat: ChatTemplate) -> bool:
    if "messages" not in entry:
        return True
    try:
        return chat.render(entry["messages"]) == entry["prompt"]
    except ChatTemplateError:
        return False


def replay_goldens(
    engine: Engine, golden: Sequence[dict[str, Any]], chat: ChatTemplate = NO_CHAT_TEMPLATE
) -> list[dict[str, Any]]:
    """Generate each recorded prompt again; one result per golden, `ok` when the prompt
    encodes to the same ids (and a conversation renders to the same prompt through `chat`)
    and the continuation has the same token ids."""
    from aieng_core.serving.request import SamplingParams

    if not golden:
        return []
    params = [SamplingParams(max_new_tokens=int(entry["max_new_tokens"])) for entry in golden]
    outputs = engine.generate([entry["prompt"] for entry in golden], params)
    results = []
    for entry, output in zip(golden, outputs):
        same_prompt = engine.encode(entry["prompt"]) == list(entry["prompt_ids"])
        same_render = _rendered_again(entry, chat)
        results.append(
            {
                "prompt": entry["prompt"],
                "conversation": "messages" in entry,
                "ok": same_prompt and same_render and list(output.token_ids) == list(entry["token_ids"]),
                "prompt_ids_match": same_prompt,
                "rendered_match": same_render,
                "expected_token_ids": list(entry["token_ids"]),
                "got_token_ids": list(output.token_ids),
                "expected_text": entry["text"],
                "got_text": output.text,
            }
        )
    return results
