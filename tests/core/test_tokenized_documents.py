"""tokenized_documents: one row of token ids per clean row, each ending with EOS."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from aieng_core.data.tables import CLEAN_FILE, TOKENS_FILE, TOKENS_SCHEMA
from aieng_core.dataset.consistency import tokenized_consistency
from aieng_core.store import ArtifactNotFound, ArtifactStore
from aieng_core.tokenizer.bpe import load_tokenizer
from aieng_core.tokenizer.bpe_tokenizer import KIND as TOKENIZER_KIND
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents, refuse_stray_specials
from tests.conftest import DEMO_PARTITIONS, land
from tests.core.helpers import BuiltHome, build_data, jsonl, read_table


@pytest.mark.parametrize("partition", DEMO_PARTITIONS)
def test_rows_match_clean_rows_and_end_with_eos(built_demo: BuiltHome, partition: str) -> None:
    tokenized = built_demo.tokenized[partition]
    clean_rows = read_table(built_demo.clean[partition].file(CLEAN_FILE))
    rows = read_table(tokenized.file(TOKENS_FILE))
    tokenizer = load_tokenizer(built_demo.tokenizer.path)
    eos = tokenizer.token_to_id(built_demo.config.tokenizer.eos_token)
    pad = tokenizer.token_to_id(built_demo.config.tokenizer.pad_token)
    assert (
        len(rows) == len(clean_rows) == built_demo.clean[partition].metrics["rows_clean"] == tokenized.metrics["rows"]
    )
    assert [r["id"] for r in rows] == [r["id"] for r in clean_rows]
    for row in rows:
        assert row["input_ids"][-1] == eos
        assert eos not in row["input_ids"][:-1] and pad not in row["input_ids"]
        assert row["num_tokens"] == len(row["input_ids"])
    assert tokenized.metrics["tokens"] == sum(r["num_tokens"] for r in rows)
    for row, clean in list(zip(rows, clean_rows))[:25]:
        assert row["input_ids"][:-1] == tokenizer.encode(clean["text"], add_special_tokens=False).ids
        assert tokenizer.decode(row["input_ids"][:-1]) == clean["text"]


@pytest.mark.parametrize("partition", DEMO_PARTITIONS)
def test_manifest_records_the_tokenizer(built_demo: BuiltHome, partition: str) -> None:
    tokenized = built_demo.tokenized[partition]
    assert tokenized.manifest["tokenizer_id"] == built_demo.tokenizer.id
    assert tokenized.metrics["tokenizer_id"] == built_demo.tokenizer.id
    assert tokenized.manifest["inputs"] == [
        {"kind": "clean_documents", "id": built_demo.clean[partition].id},
        {"kind": TOKENIZER_KIND, "id": built_demo.tokenizer.id},
    ]
    assert pq.read_schema(tokenized.file(TOKENS_FILE)).remove_metadata() == TOKENS_SCHEMA
    assert built_demo.store.verify(tokenized) == []


def test_consistency_check_passes_on_a_built_home(built_demo: BuiltHome) -> None:
    assert tokenized_consistency(built_demo.store) == {"passed": True, "partitions": DEMO_PARTITIONS, "problems": []}


def test_same_inputs_same_content_hash(built_demo: BuiltHome, built_demo_reversed: BuiltHome) -> None:
    for partition in DEMO_PARTITIONS:
        assert built_demo.tokenized[partition].content_sha256 == built_demo_reversed.tokenized[partition].content_sha256


def test_rebuild_is_reused(copy_home, built_demo: BuiltHome) -> None:
    store = ArtifactStore(copy_home(built_demo))
    again = build_tokenized_documents(store, built_demo.config, "2026-01-01")
    assert again.reused and again.id == built_demo.tokenized["2026-01-01"].id


def test_needs_clean_documents_and_a_tokenizer(
    store: ArtifactStore, tiny_config, copy_home, built_demo: BuiltHome
) -> None:
    with pytest.raises(ArtifactNotFound, match="clean_documents"):
        build_tokenized_documents(store, tiny_config, "2026-01-01")
    copied = copy_home(built_demo)
    (copied / "refs" / TOKENIZER_KIND / "_unpartitioned.json").unlink()
    with pytest.raises(ArtifactNotFound, match=TOKENIZER_KIND):
        build_tokenized_documents(ArtifactStore(copied), tiny_config, "2026-01-01")


def test_empty_clean_partition_tokenizes_to_zero_rows(copy_home, built_demo: BuiltHome) -> None:
    from aieng_core.data.clean_documents import build_clean_documents
    from aieng_core.data.raw_documents import build_raw_documents
    from tests.conftest import land

    home = copy_home(built_demo)
    store = ArtifactStore(home)
    land(home, "2026-01-09", "junk.jsonl", b"{not json\n")
    build_raw_documents(store, built_demo.config, "2026-01-09")
    build_clean_documents(store, built_demo.config, "2026-01-09")
    tokenized = build_tokenized_documents(store, built_demo.config, "2026-01-09")
    assert tokenized.metrics["rows"] == 0 and tokenized.metrics["tokens"] == 0
    assert read_table(tokenized.file(TOKENS_FILE)) == []


def test_special_token_text_inside_documents_is_tokenized_as_text(copy_home, built_demo: BuiltHome) -> None:
    """Only the pipeline ends a document: EOS or pad text inside one stays text."""
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    texts = {
        "eos": "A document that mentions <|endoftext|> in the middle of it.",
        "pad": "Padding written out: <|pad|><|pad|> and more words after.",
        "both": "<|endoftext|> at the start and <|pad|> near the end <|endoftext|>",
    }
    land(home, "2026-01-09", "specials.jsonl", jsonl(*[{"id": key, "text": text} for key, text in texts.items()]))
    build_data(store, built_demo.config, ["2026-01-09"])
    tokenized = build_tokenized_documents(store, built_demo.config, "2026-01-09")
    tokenizer = load_tokenizer(built_demo.tokenizer.path)
    eos, pad = tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|pad|>")
    rows = read_table(tokenized.file(TOKENS_FILE))
    assert sorted(row["id"] for row in rows) == sorted(texts)
    for row in rows:
        assert row["input_ids"].count(eos) == 1 and row["input_ids"][-1] == eos, row["id"]
        assert pad not in row["input_ids"], row["id"]
        assert tokenizer.decode(row["input_ids"][:-1]) == texts[row["id"]]


def test_stray_special_ids_stop_tokenizing() -> None:
    specials = np.array([0, 1], dtype=np.int32)
    offsets = np.array([0, 3, 5, 6])  # rows of 3, 2 and 1 tokens, each ending with EOS (0)
    refuse_stray_specials(np.array([7, 8, 0, 9, 0, 0], dtype=np.int32), offsets, specials, ["a", "b", "c"])
    with pytest.raises(RuntimeError, match=r"2 documents \('a', 'b'\)"):
        refuse_stray_specials(np.array([7, 1, 0, 0, 0, 0], dtype=np.int32), offsets, specials, ["a", "b", "c"])
    with pytest.raises(RuntimeError, match="1 documents"):
        refuse_stray_specials(np.array([0, 8, 0], dtype=np.int32), np.array([0, 3]), specials, ["a"])
