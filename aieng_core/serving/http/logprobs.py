"""The engine's log-probabilities (request.TokenLogprob) in OpenAI's two shapes.

Completions (the legacy shape): `tokens`, `token_logprobs`, `top_logprobs` (per token a map
of the top tokens' texts to their log-probabilities, the chosen token included, as vLLM
answers) and `text_offset` (where each token's text starts in the choice's text). Chat:
`content`, a list of {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}.

A byte-level BPE token can hold part of a UTF-8 character; its `token` text then holds a
replacement character, and `bytes` (chat) its exact bytes. A token's text offset counts the
characters of the choice's text completed before it (the text is decoded with
errors="replace", as the engine's detokenizer decodes it), so offsets index the text itself.
Special tokens (EOS) add nothing to the text: their `token` is their name, their `bytes` empty,
so a reply's `bytes`, joined, are its text exactly; except after a stop string: the token that
completed it is listed (as vLLM lists it) though the text ends before the stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from aieng_core.serving.request import TokenLogprob

LOWEST = -9999.0  # vLLM's floor: JSON has no -inf


class TokenTexts:
    """Each token id's text and bytes, as the logprobs shapes name them."""

    def __init__(self, tokenizer: Tokenizer, table: Sequence[bytes]) -> None:
        self.tokenizer = tokenizer
        self.table = table

    def bytes_of(self, token: int) -> bytes:
        return self.table[token] if token < len(self.table) else b""

    def text(self, token: int) -> str:
        raw = self.bytes_of(token)
        if raw:
            return raw.decode("utf-8", errors="replace")
        return self.tokenizer.id_to_token(token) or ""  # a special token: its name

    def label_bytes(self, token: int) -> list[int]:
        """What the token adds to the text: nothing for a special token (EOS), whatever its name."""
        return list(self.bytes_of(token))


def floor(value: float) -> float:
    return max(value, LOWEST)


class CompletionLogprobsStream:
    """The legacy shape of one choice, chunk by chunk (text offsets run on across chunks)."""

    def __init__(self, texts: TokenTexts, offset: int = 0) -> None:
        self.texts = texts
        self.offset = offset  # characters of the choice's text before the next token's
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def of(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        texts = self.texts
        offsets = []
        for entry in entries:
            offsets.append(self.offset)
            self.offset += len(self._decoder.decode(texts.bytes_of(entry.token)))
        return {
            "tokens": [texts.text(e.token) for e in entries],
            "token_logprobs": [floor(e.logprob) for e in entries],
            "top_logprobs": [{texts.text(t): floor(v) for t, v in ((e.token, e.logprob), *e.top)} for e in entries],
            "text_offset": offsets,
        }


def chat_logprobs(texts: TokenTexts, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        return {"token": texts.text(token), "logprob": floor(logprob), "bytes": texts.label_bytes(token)}

    return {
        "content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries],
        "refusal": None,
    }
