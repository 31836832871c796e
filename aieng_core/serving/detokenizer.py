"""Token ids to streamed text, never half a character and never a stop string.

Byte-level BPE splits multi-byte UTF-8 characters across tokens, so bytes go through an
incremental UTF-8 decoder that holds an incomplete character until its last byte arrives.
Text that could be the start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from functools import cache

from tokenizers import Tokenizer


@cache
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others
    for the code points from 256 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(char): byte for byte, char in zip(printable, chars)}


def token_bytes_table(tokenizer: Tokenizer) -> list[bytes]:
    """The bytes each token id stands for, indexed by id, as `tokenizer.decode` reads them:
    special tokens are skipped (b""), other added tokens stand for their own text."""
    to_byte = _unicode_to_byte()
    added = tokenizer.get_added_tokens_decoder()
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    for token, token_id in vocab.items():
        if token_id in added:
            table[token_id] = b"" if added[token_id].special else added[token_id].content.encode("utf-8")
            continue
        try:
            table[token_id] = bytes(to_byte[char] for char in token)
        except KeyError as error:
            raise ValueError(f"token {token_id} ({token!r}) is not byte-level BPE: {error} has no byte") from None
    return table


class IncrementalDetokenizer:
    """Push token ids one at a time; each push returns the text now safe to emit.

    Invariant: every push() return plus flush() concatenated equals the whole byte stream
    decoded with errors="replace", cut before the first stop string to be completed (the
    one that ends earliest in the text; of those ending at the same place, the longest).
    """

    def __init__(self, table: Sequence[bytes], stop: tuple[str, ...] = ()) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        self._table = table
        self._stop = stop
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._emitted: list[str] = []
        self._held = ""  # decoded text that may be the start of a stop string
        self._stopped = False
        self.stop_string: str | None = None  # the stop string that ended the text, once one has

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def text(self) -> str:
        return "".join(self._emitted) + self._held

    def push(self, token_id: int) -> str:
        if self._stopped:
            return ""
        return self._emit(self._decoder.decode(self._table[token_id]), final=False)

    def flush(self) -> str:
        """The rest at the end of the stream: held text, and U+FFFD for trailing incomplete bytes."""
        if self._stopped:
            return ""
        return self._emit(self._decoder.decode(b"", final=True), final=True)

    def _emit(self, new: str, final: bool) -> str:
        if not self._stop:
            if new:
                self._emitted.append(new)
            return new
        pending = self._held + new
        cut = self._find_stop(pending)
        if cut is not None:
            ready, self._held, self._stopped = pending[:cut], "", True
        else:
            hold = 0 if final else self._stop_prefix_length(pending)
            ready, self._held = pending[: len(pending) - hold], pending[len(pending) - hold :]
        if ready:
            self._emitted.append(ready)
        return ready

    def _find_stop(self, text: str) -> int | None:
        # Earlier text never holds a stop string's start (it was held back), so searching the
        # pending text alone finds every match.
        best: tuple[int, int] | None = None  # (end, -length): earliest end, then longest
        for stop in self._stop:
            start = text.find(stop)
            if start >= 0 and (best is None or (start + len(stop), -len(stop)) < best):
                best = (start + len(stop), -len(stop))
                self.stop_string = stop
        return None if best is None else best[0] + best[1]

    def _stop_prefix_length(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
