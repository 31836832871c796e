"""Incremental detokenizer: never half a character, the stream equals the one-shot decode,
stop strings cut the text and are never emitted, however the bytes are split into tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models

from aieng_core.config import TokenizerConfig
from aieng_core.serving.detokenizer import IncrementalDetokenizer, token_bytes_table
from aieng_core.tokenizer.bpe import special_token_id, train_bpe

TEXTS = [
    "我们的语料里有中文，也有 English words and emoji 😀🎉 like this. 中文分词是一个问题。",
    "The quick brown fox jumps over the lazy dog. 你好，世界！Ünïcödé façade, naïve café.",
    "Stop strings like END or ### may span tokens: the end is near. 😀😀 👩‍💻 🇫🇷",
]
ORDINARY = [
    *TEXTS,
    "A sentence the tokenizer never saw: 机器学习模型的训练需要大量数据。🚀🧪",
    "  leading spaces, tabs\tand\nnewlines\r\n",
    "Mixed 中 English 文 🎉 at every 字 boundary",
]
BYTE_TABLE = [bytes([b]) for b in range(256)]  # one byte per token: every possible split


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    # Small enough to train in milliseconds; merges of Chinese and emoji bytes give tokens
    # that end in the middle of a character.
    return train_bpe(iter(TEXTS * 30), TokenizerConfig(vocab_size=420, min_frequency=1))


@pytest.fixture(scope="module")
def table(tokenizer: Tokenizer) -> list[bytes]:
    return token_bytes_table(tokenizer)


def stream(table: list[bytes], ids: list[int], stop: tuple[str, ...] = ()) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(table, stop)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    return pieces, detok


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text cut before the stop string that completes first (earliest end, then longest)."""
    ends = [(text.find(s) + len(s), -len(s)) for s in stop if s in text]
    if not ends:
        return text
    end, minus_length = min(ends)
    return text[: end + minus_length]


def test_the_tokenizer_has_tokens_that_split_a_character(table: list[bytes]) -> None:
    split = [b for b in table if len(b) > 1 and "\ufffd" in b.decode("utf-8", "replace")]
    assert len(split) > 10


def test_the_table_decodes_as_the_tokenizer_does(tokenizer: Tokenizer, table: list[bytes]) -> None:
    eos = special_token_id(tokenizer, "<|endoftext|>")
    assert table[eos] == b""
    assert len(table) == tokenizer.get_vocab_size()
    for text in ORDINARY:
        ids = tokenizer.encode(text).ids
        assert b"".join(table[i] for i in ids).decode("utf-8") == tokenizer.decode(ids) == text
        with_eos = [eos, *ids, eos]
        assert b"".join(table[i] for i in with_eos).decode("utf-8") == tokenizer.decode(with_eos)


def test_a_non_special_added_token_stands_for_its_text(tokenizer: Tokenizer) -> None:
    extended = Tokenizer.from_str(tokenizer.to_str())
    extended.add_tokens(["<tool>"])
    ids = extended.encode("call <tool> now").ids

    assert b"".join(token_bytes_table(extended)[i] for i in ids).decode() == extended.decode(ids) == "call <tool> now"


def test_a_tokenizer_that_is_not_byte_level_is_refused() -> None:
    word_level = Tokenizer(models.WordLevel({"中文": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match="not byte-level BPE"):
        token_bytes_table(word_level)


def test_a_character_split_over_tokens_is_held_until_complete() -> None:
    table = ["中".encode()[:1], "中".encode()[1:], "😀".encode()[:3], "😀".encode()[3:], b"a"]
    detok = IncrementalDetokenizer(table)

    assert [detok.push(i) for i in [0, 1, 4, 2, 3]] == ["", "中", "a", "", "😀"]
    assert detok.flush() == ""
    assert detok.text == "中a😀"


def test_incomplete_trailing_bytes_become_one_replacement_at_the_end() -> None:
    table = ["中".encode()[:2], b"x"]
    detok = IncrementalDetokenizer(table)

    assert [detok.push(1), detok.push(0)] == ["x", ""]
    assert detok.flush() == "\ufffd"
    assert detok.text == "x\ufffd" == (b"x" + "中".encode()[:2]).decode("utf-8", "replace")


@pytest.mark.parametrize("text", ORDINARY)
def test_valid_text_streams_whole_characters_only(tokenizer: Tokenizer, table: list[bytes], text: str) -> None:
    for token_table, ids in [(table, tokenizer.encode(text).ids), (BYTE_TABLE, list(text.encode()))]:
        pieces, detok = stream(token_table, ids)

        assert all("\ufffd" not in piece for piece in pieces)
        assert all(piece.encode("utf-8").decode("utf-8") == piece for piece in pieces)
        assert "".join(pieces) == detok.text == text


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_stream_equals_the_one_shot_decode_for_any_ids(table: list[bytes], data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, len(table) - 1), max_size=40))
    expected = b"".join(table[i] for i in ids).decode("utf-8", "replace")

    pieces, detok = stream(table, ids)

    assert "".join(pieces) == detok.text == expected
    assert not detok.stopped


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=60))
def test_invalid_bytes_are_replaced_exactly_as_bytes_decode_does(raw: bytes) -> None:
    pieces, detok = stream(BYTE_TABLE, list(raw))

    assert "".join(pieces) == detok.text == raw.decode("utf-8", "replace")


def test_a_stop_string_spanning_tokens_cuts_the_text_before_it() -> None:
    table = [b"Hello ", b"wor", b"ld E", b"N", b"D and more", b"ND"]
    detok = IncrementalDetokenizer(table, stop=("END",))

    # "ld E": the E might start END, so it waits; "N" too; "D and more" completes it.
    assert [detok.push(i) for i in [0, 1, 2, 3]] == ["Hello ", "wor", "ld ", ""]
    assert detok.push(4) == ""
    assert (detok.stopped, detok.stop_string, detok.text) == (True, "END", "Hello world ")
    assert detok.push(0) == "" and detok.flush() == ""
    assert detok.text == "Hello world "


def test_held_text_that_turns_out_not_to_be_a_stop_string_is_released() -> None:
    table = [b"ab", b"E", b"N", b"x", b"ENE"]
    detok = IncrementalDetokenizer(table, stop=("END",))

    assert [detok.push(i) for i in [0, 1, 2, 3]] == ["ab", "", "", "ENx"]
    # "ENE": "EN" cannot lead to END any more, the last "E" still can.
    assert detok.push(4) == "EN"
    assert detok.flush() == "E"
    assert (detok.stopped, detok.text) == (False, "abENxENE")


def test_a_stop_string_inside_a_multibyte_split_is_found_once_the_character_completes() -> None:
    stop_char = "。".encode()
    table = [b"done", stop_char[:1], stop_char[1:], b"after"]
    detok = IncrementalDetokenizer(table, stop=("。",))

    assert [detok.push(i) for i in [0, 1, 2, 3]] == ["done", "", "", ""]
    assert (detok.stopped, detok.text) == (True, "done")


def test_the_stop_string_that_completes_first_wins() -> None:
    table = [b"a", b"b", b"c", b"d", b"abcd"]
    one_by_one, _ = stream(table, [0, 1, 2, 3], stop=("abcd", "bc"))
    all_at_once, _ = stream(table, [4], stop=("abcd", "bc"))
    same_end, detok = stream(table, [4], stop=("cd", "abcd"))

    assert "".join(one_by_one) == "".join(all_at_once) == "a"
    assert ("".join(same_end), detok.stop_string) == ("", "abcd")


def test_without_a_stop_string_nothing_is_held() -> None:
    detok = IncrementalDetokenizer([b"E", b"N"])
    assert [detok.push(0), detok.push(1)] == ["E", "N"]


def test_empty_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        IncrementalDetokenizer(BYTE_TABLE, stop=("END", ""))


STOP_ALPHABET = "ab中😀"


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet=STOP_ALPHABET + "c", max_size=30),
    stop=st.lists(st.text(alphabet=STOP_ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3).map(tuple),
    data=st.data(),
)
def test_stop_strings_are_never_emitted_however_the_bytes_are_split(
    text: str, stop: tuple[str, ...], data: st.DataObject
) -> None:
    raw = text.encode()
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=len(raw))))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)]) if raw[a:b]]
    expected = cut_at_stop(text, stop)

    pieces, detok = stream(chunks, list(range(len(chunks))), stop)

    assert "".join(pieces) == detok.text == expected
    assert detok.stopped == (expected != text)
    # A piece may end with text that only later proves not to be a stop string, but no stop
    # string ever appears in what was emitted so far.
    emitted = ""
    for piece in pieces:
        emitted += piece
        assert not any(s in emitted for s in stop)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="ab中😀。 \n", max_size=40), stop=st.sampled_from([("。",), ("中中",), ("a 😀", "\n\n")]))
def test_stop_strings_with_the_real_tokenizer(tokenizer: Tokenizer, table: list[bytes], text: str, stop) -> None:
    pieces, detok = stream(table, tokenizer.encode(text).ids, stop)

    assert "".join(pieces) == detok.text == cut_at_stop(text, stop)
    assert all("\ufffd" not in piece for piece in pieces)
