"""Decoding one unit: strict UTF-8, then fallbacks, with GB18030 only where it looks Chinese."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aieng_core.data.decoding import decode_unit, plausibly_chinese

ZH = "数据管道每天凌晨读取新落地的原始文本。"


@pytest.mark.parametrize(
    "data, reason",
    [
        ("Zürich".encode("latin-1"), "ambiguous_encoding"),  # strict GB18030 reads "Z黵ich"
        ("Müller und Söhne".encode("cp1252"), "ambiguous_encoding"),
        ("“smart quotes” in cp1252".encode("cp1252"), "undecodable"),  # 0x94 0x20 is not GB18030
        ("año, café, élève".encode("latin-1"), "undecodable"),
        ("Configuração da aplicação".encode("latin-1"), "ambiguous_encoding"),  # "çã" pairs as a GB2312 code
        ("Informações, Ação".encode("cp1252"), "ambiguous_encoding"),
        (b"emoji \xed\xa0\xbd\xed\xb8\x80 as CESU-8", "ambiguous_encoding"),  # surrogates encoded as UTF-8
        (b"nul as Java writes it: \xc0\x80", "ambiguous_encoding"),  # overlong UTF-8
        (b"overlong slash \xe0\x80\xaf", "undecodable"),
        (b"\xff\xfe\xff not text", "undecodable"),
        ("cut off inside 中".encode()[:-1], "undecodable"),  # would be GB18030 "涓"
        ("数据管道每天凌晨读取".encode().replace(b"\xe6\xaf\x8f", b"\xe6\xaf\xff"), "undecodable"),
    ],
)
def test_wrong_or_ambiguous_bytes_never_become_text(data: bytes, reason: str) -> None:
    decoded = decode_unit(data)
    assert (decoded.text, decoded.reason) == (None, reason)
    assert decoded.detail


def test_hints_name_the_likely_encoding() -> None:
    assert "CESU-8" in decode_unit(b"\xed\xa0\xbd\xed\xb8\x80").detail
    assert "overlong" in decode_unit(b"a\xc0\x80").detail
    assert "cut off" in decode_unit(b"truncated \xe4\xb8").detail
    assert "Latin-1" in decode_unit("Zürich".encode("latin-1")).detail


@pytest.mark.parametrize("encoding", ["gbk", "gb2312", "gb18030"])
def test_real_chinese_in_gb_encodings_is_decoded(encoding: str) -> None:
    text = f"{ZH} 第二句：编码问题是老系统迁移时最常见的坑！（ASCII mixed in）"
    assert decode_unit(text.encode(encoding))[:2] == (text, "gb18030")


def test_a_configured_fallback_is_the_users_word() -> None:
    assert decode_unit("Zürich".encode("latin-1"), ("gb18030", "cp1252"))[:2] == ("Zürich", "cp1252")
    assert decode_unit("Zürich".encode("latin-1"), ()).reason == "undecodable"
    assert decode_unit(ZH.encode("gbk"), ()).reason == "undecodable"


def test_utf8_wins_even_when_gb18030_would_also_decode() -> None:
    assert decode_unit("中文中文".encode())[:2] == ("中文中文", "utf-8")


def test_plausibility_rule() -> None:
    assert plausibly_chinese(ZH.encode("gbk"))
    assert not plausibly_chinese("Zürich".encode("latin-1"))  # trail byte 0x72 is outside GB2312
    assert not plausibly_chinese("😀".encode("gb18030"))  # a 4-byte code
    assert not plausibly_chinese(b"plain ascii")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_decoded_text_is_exactly_what_the_bytes_mean(data: bytes) -> None:
    """Never text for bytes it could not have meant: the text encodes back to the same bytes
    in the encoding named, a GB decode is plausibly Chinese, and no replacement character
    appears that the bytes did not spell."""
    decoded = decode_unit(data)
    if decoded.text is None:
        assert decoded.reason in ("undecodable", "ambiguous_encoding")
        return
    assert decoded.text.encode(decoded.encoding) == data
    if decoded.encoding != "utf-8":
        assert plausibly_chinese(data)
    if "\ufffd" in decoded.text:
        assert "\ufffd".encode(decoded.encoding) in data


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="gbk", min_codepoint=0x80), min_size=1, max_size=20))
def test_gb_decodes_round_trip_or_are_refused(text: str) -> None:
    data = text.encode("gbk")
    decoded = decode_unit(data)
    if decoded.text is not None:
        assert decoded.text.encode(decoded.encoding) == data
    else:
        assert decoded.reason in ("ambiguous_encoding", "undecodable")


def test_bom_marks_are_longest_first() -> None:
    from aieng_core.data.decoding import bom_encoding

    assert bom_encoding(codecs.BOM_UTF32_LE + b"a\x00\x00\x00") == ("utf-32-le", 4)
