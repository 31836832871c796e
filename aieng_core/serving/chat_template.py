"""A conversation rendered into the prompt the model reads, through the bundle's chat template.

The template is Jinja, kept in the bundle's tokenizer_config.json under `chat_template`, as
transformers reads it: rendering here gives the text `AutoTokenizer.apply_chat_template`
gives (the same sandboxed environment: trim_blocks, lstrip_blocks, loop controls, its
`tojson`, `raise_exception` and `strftime_now`; the same variables: `messages`,
`add_generation_prompt` and the special tokens), and the prompt ids are that text encoded
without special tokens added, as apply_chat_template's `tokenize=True` does.

Framework-free (jinja2 only): the bundle builder records golden conversations with it, the
bundle check and the server render with it.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from aieng_core.hashing import sha256_bytes

TEMPLATE_KEY = "chat_template"  # in tokenizer_config.json
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # tokenizer/bpe.py's; spelled out to keep tokenizers out
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ChatTemplateError(ValueError):
    """A conversation the template refuses (its raise_exception), or a template that fails."""


def template_sha256(template: str) -> str:
    """What the bundle manifest and the lineage name the template by."""
    return sha256_bytes(template.encode("utf-8"))


def special_tokens(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens a template may use, from tokenizer_config.json (as transformers
    passes its special_tokens_map)."""
    return {key: tokenizer_config[key] for key in SPECIAL_TOKEN_KEYS if isinstance(tokenizer_config.get(key), str)}


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' own: Jinja's built-in tojson escapes HTML characters.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return dt.datetime.now().strftime(format)


@functools.lru_cache(maxsize=16)
def compiled(template: str) -> jinja2.Template:
    """The template compiled once per text; ChatTemplateError if it does not parse."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    try:
        return environment.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template does not parse: {exc} (line {exc.lineno})") from None


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    specials: Mapping[str, str],
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text of `messages` (each {role, content} with string content)."""
    try:
        return compiled(template).render(
            messages=[dict(message) for message in messages],
            add_generation_prompt=add_generation_prompt,
            tools=None,
            documents=None,
            **specials,
        )
    except jinja2.exceptions.TemplateError as exc:  # raise_exception, undefined names, sandbox refusals
        raise ChatTemplateError(f"the chat template refused the conversation: {exc}") from None
    except Exception as exc:  # the template's own operations on this conversation (TypeError, ...)
        raise ChatTemplateError(f"the chat template failed on the conversation: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class ChatTemplate:
    """A bundle's chat template (source None: it has none) and the special tokens it may use."""

    source: str | None
    specials: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of_directory(cls, directory: Path) -> ChatTemplate:
        """The template in `directory`'s tokenizer_config.json, as transformers would read it."""
        path = Path(directory) / TOKENIZER_CONFIG_FILE
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: unreadable: {exc}") from None
        source = config.get(TEMPLATE_KEY) if isinstance(config, dict) else None
        if source is not None and not isinstance(source, str):
            # transformers also takes a list of named templates; a bundle writes one string.
            raise ValueError(f"{path}: {TEMPLATE_KEY} must be one Jinja string, got {type(source).__name__}")
        return cls(source or None, special_tokens(config) if isinstance(config, dict) else {})

    @property
    def sha256(self) -> str | None:
        return None if self.source is None else template_sha256(self.source)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        if self.source is None:
            raise ChatTemplateError("there is no chat template")
        return render_chat(self.source, messages, self.specials, add_generation_prompt)


NO_CHAT_TEMPLATE = ChatTemplate(None)


def with_template(tokenizer_config_path: Path, template: str) -> None:
    """Add `template` to a tokenizer_config.json (the bundle's copy), in the file's own layout."""
    config = json.loads(tokenizer_config_path.read_text(encoding="utf-8"))
    config[TEMPLATE_KEY] = template
    tokenizer_config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
