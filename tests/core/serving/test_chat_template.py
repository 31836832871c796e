"""Chat templates render as transformers renders them, and encode to the ids
`AutoTokenizer.apply_chat_template` gives, for the bundle's own template and for ugly
conversations; the bundle carries the template and its golden conversations."""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from aieng_core.bundle.serving_bundle import GOLDEN_FILE
from aieng_core.bundle.verify import load_bundle
from aieng_core.config.serving_sections import DEFAULT_CHAT_TEMPLATE
from aieng_core.serving.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    render_chat,
    template_sha256,
)
from tests.bundle_fixtures import BundledHome

SPECIALS = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"}

UGLY_CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "  leading and trailing  \n"}, {"role": "user", "content": "数据清洗 🙂 \u00e9"}],
    [{"role": "user", "content": "a literal <|endoftext|> and {{ not a tag }} and {% raw %}"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "\n\n"}, {"role": "user", "content": "\t"}],
    [{"role": "user", "content": "quotes \" ' and \\ backslashes\r\nCRLF"}],
    [{"role": "user", "content": "x" * 2000}],
]

# Templates in the shapes models ship with: whitespace control, loop variables, namespaces,
# tojson, a system message read apart, the special tokens.
OTHER_TEMPLATES = [
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}",
    "{{ bos_token }}{% for m in messages %}{% if loop.first and m['role'] == 'system' %}[SYS] {{ m['content'] }}\n"
    "{% else %}{{ m['role'] | upper }}: {{ m['content'] | trim }}{{ eos_token }}\n{% endif %}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }} "
    "{{ m | tojson }}\n{% endfor %}",
]


def transformers_render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt, **SPECIALS
    )
    return rendered[0]


@pytest.mark.parametrize("messages", UGLY_CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_default_template_renders_as_transformers_does(messages, add_generation_prompt) -> None:
    ours = render_chat(DEFAULT_CHAT_TEMPLATE, messages, SPECIALS, add_generation_prompt)
    assert ours == transformers_render(DEFAULT_CHAT_TEMPLATE, messages, add_generation_prompt)


@pytest.mark.parametrize("template", OTHER_TEMPLATES)
@pytest.mark.parametrize("messages", UGLY_CONVERSATIONS[:3])
def test_other_templates_render_as_transformers_does(template, messages) -> None:
    assert render_chat(template, messages, SPECIALS) == transformers_render(template, messages)


def test_a_role_the_template_refuses_and_a_broken_template_are_named() -> None:
    with pytest.raises(ChatTemplateError, match="roles are system, user and assistant, not tool"):
        render_chat(DEFAULT_CHAT_TEMPLATE, [{"role": "tool", "content": "x"}], SPECIALS)
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat("{% for m in messages %}", [{"role": "user", "content": "x"}], SPECIALS)
    with pytest.raises(ChatTemplateError, match="refused the conversation"):
        render_chat("{{ messages[0].missing.deeper }}", [{"role": "user", "content": "x"}], SPECIALS)
    with pytest.raises(ChatTemplateError, match="failed on the conversation: TypeError"):
        render_chat("{{ messages[0].content - 1 }}", [{"role": "user", "content": "x"}], SPECIALS)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate(None).render([{"role": "user", "content": "x"}])


def test_the_sandbox_refuses_reaching_python_internals() -> None:
    with pytest.raises(ChatTemplateError):
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", [], SPECIALS)


def test_the_bundle_ships_the_template_transformers_reads(serving_bundle_artifact: BundledHome) -> None:
    bundle = serving_bundle_artifact.bundle
    tokenizer_config = json.loads((bundle.path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert tokenizer_config["chat_template"] == DEFAULT_CHAT_TEMPLATE
    assert bundle.metrics["chat_template_sha256"] == template_sha256(DEFAULT_CHAT_TEMPLATE)
    hf = AutoTokenizer.from_pretrained(str(bundle.path))
    loaded = load_bundle(bundle.path)
    assert loaded.chat_template.source == DEFAULT_CHAT_TEMPLATE
    for messages in UGLY_CONVERSATIONS:
        text = loaded.chat_template.render(messages)
        assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = loaded.tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == list(hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"])


def test_the_bundle_records_its_golden_conversations(serving_bundle_artifact: BundledHome) -> None:
    bundle = serving_bundle_artifact.bundle
    recipe = serving_bundle_artifact.config.bundle
    golden: list[dict[str, Any]] = json.loads(bundle.file(GOLDEN_FILE).read_text(encoding="utf-8"))["outputs"]
    conversations = [entry for entry in golden if "messages" in entry]
    assert [entry["messages"] for entry in conversations] == [
        [turn.model_dump() for turn in turns] for turns in recipe.golden_conversations
    ]
    assert bundle.metrics["golden_conversations"] == len(recipe.golden_conversations) == 2
    assert len(golden) == len(recipe.golden_prompts) + 2
    hf = AutoTokenizer.from_pretrained(str(bundle.path))
    for entry in conversations:
        assert entry["prompt"] == hf.apply_chat_template(entry["messages"], tokenize=False, add_generation_prompt=True)
        assert entry["prompt_ids"] == list(
            hf.apply_chat_template(entry["messages"], tokenize=True, add_generation_prompt=True)["input_ids"]
        )
