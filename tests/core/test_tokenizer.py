"""bpe_tokenizer: deterministic, loadable by transformers, pinned, retrained on request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from aieng_core.config import TokenizerConfig
from aieng_core.data.clean_documents import KIND as CLEAN_KIND
from aieng_core.data.tables import CLEAN_FILE, num_rows
from aieng_core.store import ArtifactNotFound, ArtifactStore
from aieng_core.tokenizer.bpe import (
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
    capped,
    load_tokenizer,
    round_trip_failures,
    special_ids,
    train_bpe,
)
from aieng_core.tokenizer.bpe_tokenizer import CODE_VERSION, KIND, build_bpe_tokenizer, round_trip_report
from tests.conftest import DEMO_PARTITIONS, land
from tests.core.helpers import BuiltHome, build_data, jsonl, lowercasing_tokenizer, read_table, sentences

NEW_PARTITION = "2026-01-04"


def land_sentences(home: Path, partition: str, seed: int, count: int = 40) -> None:
    land(
        home,
        partition,
        "docs.jsonl",
        jsonl(*[{"id": f"{partition}-{i}", "text": t} for i, t in enumerate(sentences(count, seed))]),
    )


def test_artifact_files_and_manifest(built_demo: BuiltHome) -> None:
    tokenizer = built_demo.tokenizer
    assert sorted(tokenizer.manifest["files"]) == sorted(TOKENIZER_FILES)
    assert tokenizer.manifest["code_version"] == CODE_VERSION
    assert tokenizer.manifest["config_sha256"] == built_demo.config.section_sha256("tokenizer")
    assert tokenizer.manifest["inputs"] == [{"kind": CLEAN_KIND, "id": built_demo.clean[p].id} for p in DEMO_PARTITIONS]
    assert tokenizer.metrics["vocab_size"] == built_demo.config.tokenizer.vocab_size == 512
    assert tokenizer.metrics["training_partitions"] == DEMO_PARTITIONS
    assert tokenizer.metrics["training_chars"] == sum(
        built_demo.clean[p].metrics["chars_clean"] for p in DEMO_PARTITIONS
    )
    assert built_demo.store.verify(tokenizer) == []


def test_deterministic_across_fresh_homes(built_demo: BuiltHome, built_demo_reversed: BuiltHome) -> None:
    a, b = built_demo.tokenizer, built_demo_reversed.tokenizer
    assert a.path != b.path
    assert a.file(TOKENIZER_FILE).read_bytes() == b.file(TOKENIZER_FILE).read_bytes()
    assert a.content_sha256 == b.content_sha256
    assert a.id == b.id


def test_loads_with_transformers(built_demo: BuiltHome) -> None:
    from transformers import AutoTokenizer

    path = built_demo.tokenizer.path
    hf = AutoTokenizer.from_pretrained(str(path))
    raw = load_tokenizer(path)
    assert hf.pad_token == "<|pad|>"
    assert hf.eos_token == "<|endoftext|>"
    assert hf.pad_token_id == raw.token_to_id("<|pad|>")
    assert hf.eos_token_id == raw.token_to_id("<|endoftext|>")
    assert hf.pad_token_id != hf.eos_token_id
    assert len(hf) == raw.get_vocab_size() == 512
    text = "def main():\n    return 42  # 数据 ✓"
    ids = hf(text)["input_ids"]
    assert ids == raw.encode(text, add_special_tokens=False).ids  # no BOS/EOS added behind our back
    assert hf.decode(ids) == text
    padded = hf(["short", "a somewhat longer input text"], padding=True)["input_ids"]
    assert len(padded[0]) == len(padded[1]) and padded[0][-1] == hf.pad_token_id


def test_byte_level_round_trip(built_demo: BuiltHome) -> None:
    tokenizer = load_tokenizer(built_demo.tokenizer.path)
    texts = ["plain English text", "中文和 emoji 🚀", "tabs\tand\nnewlines  ", "\x00\x01 binary junk \ufffd", ""]
    texts += [r["text"] for r in read_table(built_demo.clean["2026-01-01"].file(CLEAN_FILE))[:20]]
    assert round_trip_failures(tokenizer, texts) == []


SPECIAL_TEXTS = ["<|endoftext|>", "<|pad|>", "before<|endoftext|>after", "a <|pad|><|pad|> b <|endoftext|>"]


def test_special_token_text_in_a_document_is_ordinary_text(built_demo: BuiltHome) -> None:
    tokenizer = load_tokenizer(built_demo.tokenizer.path)
    specials = special_ids(tokenizer)
    assert specials == {tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|pad|>")}
    single = [tokenizer.encode(text, add_special_tokens=False).ids for text in SPECIAL_TEXTS]
    batched = [encoding.ids for encoding in tokenizer.encode_batch_fast(SPECIAL_TEXTS, add_special_tokens=False)]
    assert single == batched
    for text, ids in zip(SPECIAL_TEXTS, batched):
        assert not specials & set(ids), text
        assert tokenizer.decode(ids) == text
    assert round_trip_failures(tokenizer, SPECIAL_TEXTS) == []
    # The switch is not stored in tokenizer.json: loaded without load_tokenizer, the same
    # texts become special ids, and the round-trip check says so.
    unguarded = Tokenizer.from_file(str(built_demo.tokenizer.file(TOKENIZER_FILE)))
    assert unguarded.encode("<|endoftext|>", add_special_tokens=False).ids == [tokenizer.token_to_id("<|endoftext|>")]
    assert round_trip_failures(unguarded, SPECIAL_TEXTS) == SPECIAL_TEXTS


def test_transformers_also_keeps_special_token_text_as_text(built_demo: BuiltHome) -> None:
    from transformers import AutoTokenizer

    path = built_demo.tokenizer.path
    assert json.loads((path / TOKENIZER_CONFIG_FILE).read_text())["split_special_tokens"] is True
    hf = AutoTokenizer.from_pretrained(str(path))
    raw = load_tokenizer(path)
    for text in SPECIAL_TEXTS:
        ids = hf(text)["input_ids"]
        assert hf.eos_token_id not in ids and hf.pad_token_id not in ids, text
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert hf.decode(ids) == text


def test_needs_clean_text(store: ArtifactStore, tiny_config) -> None:
    with pytest.raises(ArtifactNotFound, match="clean_documents"):
        build_bpe_tokenizer(store, tiny_config)


@pytest.fixture
def small_home(home: Path, store: ArtifactStore, tiny_config):
    """Two small partitions, cleaned, and a tokenizer trained on them."""
    land_sentences(home, "2026-01-01", seed=1)
    land_sentences(home, "2026-01-02", seed=2)
    build_data(store, tiny_config, ["2026-01-01", "2026-01-02"])
    return build_bpe_tokenizer(store, tiny_config)


def test_pinned_when_a_new_partition_arrives(small_home, home: Path, store: ArtifactStore, tiny_config) -> None:
    first = small_home
    assert not first.reused
    land_sentences(home, NEW_PARTITION, seed=3)
    build_data(store, tiny_config, [NEW_PARTITION])
    again = build_bpe_tokenizer(store, tiny_config)
    assert again.reused and again.id == first.id
    assert again.metrics["training_partitions"] == ["2026-01-01", "2026-01-02"]
    assert store.list_ids(KIND) == [first.id]


def test_retrain_with_a_new_partition_gives_a_new_tokenizer(
    small_home, home: Path, store: ArtifactStore, tiny_config
) -> None:
    first = small_home
    same = build_bpe_tokenizer(store, tiny_config, retrain=True)
    assert same.id == first.id and same.reused  # retraining unchanged inputs finds the same artifact
    land_sentences(home, NEW_PARTITION, seed=3)
    build_data(store, tiny_config, [NEW_PARTITION])
    retrained = build_bpe_tokenizer(store, tiny_config, retrain=True)
    assert retrained.id != first.id and not retrained.reused
    assert retrained.metrics["training_partitions"] == ["2026-01-01", "2026-01-02", NEW_PARTITION]
    assert store.current(KIND).id == retrained.id
    assert build_bpe_tokenizer(store, tiny_config).id == retrained.id  # now pinned to the new one


def test_config_change_gives_a_new_tokenizer(small_home, store: ArtifactStore, tiny_config) -> None:
    first = small_home
    bigger = tiny_config.model_copy(update={"tokenizer": tiny_config.tokenizer.model_copy(update={"vocab_size": 600})})
    changed = build_bpe_tokenizer(store, bigger)
    assert changed.id != first.id and not changed.reused
    assert changed.manifest["config_sha256"] == bigger.section_sha256("tokenizer") != first.manifest["config_sha256"]
    assert store.current(KIND).id == changed.id
    back = build_bpe_tokenizer(store, tiny_config)  # the old config retrains to the old artifact
    assert back.id == first.id and back.reused


def test_damaged_pinned_tokenizer_is_not_used(small_home, store: ArtifactStore, tiny_config) -> None:
    first = small_home
    (first.path / TOKENIZER_FILE).write_text("{}")
    rebuilt = build_bpe_tokenizer(store, tiny_config)
    assert rebuilt.id == first.id and not rebuilt.reused
    assert store.verify(rebuilt) == []


def test_train_is_deterministic_and_specials_come_first() -> None:
    config = TokenizerConfig(vocab_size=300, min_frequency=1)
    texts = sentences(30) + ["中文文本和更多的中文文本"] * 3
    a, b = train_bpe(iter(texts), config), train_bpe(iter(texts), config)
    assert a.to_str() == b.to_str()
    assert (a.token_to_id(config.eos_token), a.token_to_id(config.pad_token)) == (0, 1)
    assert a.get_vocab_size() == 300


def test_capped_stops_after_max_chars() -> None:
    assert list(capped(["aaaa", "bbbb", "cccc"], 5)) == ["aaaa", "bbbb"]
    assert list(capped(["aaaa", "bbbb"], 4)) == ["aaaa"]
    assert list(capped(["aaaa"], 100)) == ["aaaa"]


def test_round_trip_report_covers_every_clean_row(built_demo: BuiltHome) -> None:
    report = round_trip_report(built_demo.store, batch_rows=7)
    rows = sum(num_rows(built_demo.clean[p].file(CLEAN_FILE)) for p in DEMO_PARTITIONS)
    assert report == {
        "passed": True,
        "partitions": DEMO_PARTITIONS,
        "texts_checked": rows,
        "failures": 0,
        "failing_ids": [],
    }


def test_round_trip_report_finds_a_failure_far_past_the_first_rows(
    home: Path, store: ArtifactStore, tiny_config
) -> None:
    texts = [text.lower() for text in sentences(300, seed=4)]
    texts[250] = "Only this one document has Capital letters in it."
    land(home, "2026-01-01", "docs.jsonl", jsonl(*[{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)]))
    clean = build_data(store, tiny_config, ["2026-01-01"])["2026-01-01"]
    assert num_rows(clean.file(CLEAN_FILE)) == 300
    lowercasing_tokenizer(store, texts)
    report = round_trip_report(store, batch_rows=64)
    assert report == {
        "passed": False,
        "partitions": ["2026-01-01"],
        "texts_checked": 300,
        "failures": 1,
        "failing_ids": ["2026-01-01/doc-250"],
    }


def test_round_trip_report_with_no_clean_rows_does_not_pass(home: Path, store: ArtifactStore, tiny_config) -> None:
    lowercasing_tokenizer(store, sentences(5))
    assert round_trip_report(store, batch_rows=64)["passed"] is False
