"""dataset_manifest: the data version; stable across machines, sensitive to one byte."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aieng_core.data.tables import TOKENS_FILE, TOKENS_SCHEMA
from aieng_core.dataset.dataset_manifest import (
    KIND,
    StaleTokenization,
    build_dataset_manifest,
    read_dataset,
    token_dtype,
    write_split_tokens,
)
from aieng_core.dataset.split import METHOD, TRAIN, VALIDATION, split_of
from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactNotFound, ArtifactStore
from aieng_core.tokenizer.bpe_tokenizer import build_bpe_tokenizer
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents
from tests.conftest import DEMO_PARTITIONS
from tests.core.helpers import BuiltHome, build_pipeline, read_table


def test_same_raw_inputs_give_the_same_data_version(built_demo: BuiltHome, built_demo_reversed: BuiltHome) -> None:
    a, b = built_demo, built_demo_reversed
    assert a.home != b.home
    # The landed files really differ in mtime and landing order.
    first = a.home / "raw" / "2026-01-03" / "documents.parquet"
    second = b.home / "raw" / "2026-01-03" / "documents.parquet"
    assert first.read_bytes() == second.read_bytes() and first.stat().st_mtime != second.stat().st_mtime
    assert a.dataset.content_sha256 == b.dataset.content_sha256
    for partition in DEMO_PARTITIONS:
        assert a.clean[partition].content_sha256 == b.clean[partition].content_sha256
    assert read_dataset(a.dataset) == read_dataset(b.dataset)


def test_one_changed_byte_of_raw_text_changes_the_data_version(built_demo: BuiltHome, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(built_demo.home / "raw", home / "raw")
    path = home / "raw" / "2026-01-01" / "documents.jsonl"
    data = bytearray(path.read_bytes())
    position = data.index(b'"text": "') + len(b'"text": "') + 1
    assert chr(data[position]).isalpha()
    data[position] ^= 0x20  # flip the case of one letter of the first text
    path.write_bytes(bytes(data))
    changed = build_pipeline(home, built_demo.config, DEMO_PARTITIONS)
    assert changed.clean["2026-01-01"].content_sha256 != built_demo.clean["2026-01-01"].content_sha256
    assert changed.clean["2026-01-02"].content_sha256 == built_demo.clean["2026-01-02"].content_sha256
    assert changed.dataset.content_sha256 != built_demo.dataset.content_sha256
    assert changed.clean["2026-01-01"].metrics["rows_clean"] == built_demo.clean["2026-01-01"].metrics["rows_clean"]


def test_dataset_document(built_demo: BuiltHome) -> None:
    dataset = read_dataset(built_demo.dataset)
    config = built_demo.config.dataset
    assert dataset["split"] == {
        "method": METHOD,
        "validation_fraction": config.validation_fraction,
        "seed": config.split_seed,
    }
    assert dataset["tokenizer_sha256"] == built_demo.tokenizer.content_sha256
    assert dataset["tokenizer_id"] == built_demo.tokenizer.id
    assert dataset["artifacts"] == {p: built_demo.tokenized[p].id for p in DEMO_PARTITIONS}
    assert [entry["partition"] for entry in dataset["partitions"]] == DEMO_PARTITIONS
    for entry in dataset["partitions"]:
        tokenized = built_demo.tokenized[entry["partition"]]
        assert entry["rows"] == tokenized.metrics["rows"] == built_demo.clean[entry["partition"]].metrics["rows_clean"]
        assert entry["tokens"] == tokenized.metrics["tokens"]
        assert entry["sha256"] == tokenized.content_sha256
    for key in ("rows", "tokens", "train_rows", "validation_rows", "train_tokens", "validation_tokens"):
        assert dataset["totals"][key] == sum(entry[key] for entry in dataset["partitions"])
    assert built_demo.dataset.metrics == {"partitions": 3, "partitions_without_data": [], **dataset["totals"]}
    assert built_demo.dataset.manifest["inputs"] == [{"kind": "bpe_tokenizer", "id": built_demo.tokenizer.id}] + [
        {"kind": "tokenized_documents", "id": built_demo.tokenized[p].id} for p in DEMO_PARTITIONS
    ]


@pytest.mark.parametrize("partition", DEMO_PARTITIONS)
def test_split_is_by_id_and_adds_up(built_demo: BuiltHome, partition: str) -> None:
    entry = next(e for e in read_dataset(built_demo.dataset)["partitions"] if e["partition"] == partition)
    assert entry["train_rows"] + entry["validation_rows"] == entry["rows"]
    assert entry["train_tokens"] + entry["validation_tokens"] == entry["tokens"]
    config = built_demo.config.dataset
    rows = read_table(built_demo.tokenized[partition].file(TOKENS_FILE))
    sides = [split_of(row["id"], config.validation_fraction, config.split_seed) for row in rows]
    assert sides.count(VALIDATION) == entry["validation_rows"]
    assert sum(r["num_tokens"] for r, side in zip(rows, sides) if side == TRAIN) == entry["train_tokens"]


def test_validation_share_is_near_the_fraction(built_demo: BuiltHome) -> None:
    totals = read_dataset(built_demo.dataset)["totals"]
    share = totals["validation_rows"] / totals["rows"]
    assert 0.07 < share < 0.13  # validation_fraction 0.1 over ~2400 ids


def test_split_of_examples() -> None:
    assert split_of("doc-1", 0.5, "seed") == split_of("doc-1", 0.5, "seed")
    sides = {split_of(f"doc-{i}", 0.5, "seed") for i in range(50)}
    assert sides == {TRAIN, VALIDATION}
    reseeded = [split_of(f"doc-{i}", 0.5, "other") for i in range(50)]
    assert reseeded != [split_of(f"doc-{i}", 0.5, "seed") for i in range(50)]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.text(max_size=10))
def test_split_of_is_monotonic_in_the_fraction(doc_id: str, f1: float, f2: float, seed: str) -> None:
    low, high = sorted((f1, f2))
    if split_of(doc_id, low, seed) == VALIDATION:
        assert split_of(doc_id, high, seed) == VALIDATION
    assert split_of(doc_id, 0.0, seed) == TRAIN
    assert split_of(doc_id, 1.0, seed) == VALIDATION


def test_token_files_hold_each_side_end_to_end_in_document_order(built_demo: BuiltHome) -> None:
    dataset = read_dataset(built_demo.dataset)
    config = built_demo.config.dataset
    expected: dict[str, list[int]] = {TRAIN: [], VALIDATION: []}
    for partition in DEMO_PARTITIONS:
        for row in read_table(built_demo.tokenized[partition].file(TOKENS_FILE)):
            expected[split_of(row["id"], config.validation_fraction, config.split_seed)].extend(row["input_ids"])
    for side, name in ((TRAIN, "train.bin"), (VALIDATION, "validation.bin")):
        path = built_demo.dataset.file(name)
        assert path.stat().st_size == 2 * len(expected[side])  # uint16: the tiny vocabulary has 512 ids
        assert np.fromfile(path, dtype="<u2").tolist() == expected[side]
        assert dataset["token_files"][side] == {
            "file": name,
            "dtype": "uint16",
            "byte_order": "little",
            "tokens": dataset["totals"][f"{side}_tokens"],
            "sha256": sha256_file(path),
        }
        # Listed (hashed) in the manifest, so verifying the artifact covers them.
        assert built_demo.dataset.manifest["files"][name] == sha256_file(path)
    assert len(expected[TRAIN]) + len(expected[VALIDATION]) == dataset["totals"]["tokens"]


def test_a_damaged_token_file_fails_verification(built_demo: BuiltHome, copy_home) -> None:
    store = ArtifactStore(copy_home(built_demo))
    dataset = store.require_current(KIND)
    path = dataset.file("train.bin")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert store.verify(dataset) == [f"{path}: sha256 does not match the manifest"]


def test_token_dtype_is_the_narrowest_that_holds_the_vocabulary() -> None:
    assert [token_dtype(v) for v in (512, 65_536, 65_537, 200_000)] == ["uint16", "uint16", "uint32", "uint32"]


def write_tokens_table(path: Path, rows: list[tuple[str, list[int]]]) -> None:
    table = pa.table(
        {
            "id": [doc_id for doc_id, _ in rows],
            "input_ids": [ids for _, ids in rows],
            "num_tokens": [len(ids) for _, ids in rows],
        },
        schema=TOKENS_SCHEMA,
    )
    pq.write_table(table, path)


def test_write_split_tokens_writes_little_endian_ids_of_each_side(tmp_path: Path) -> None:
    rows = [(f"doc-{i}", [70_000 + i, i, 1]) for i in range(10)]
    write_tokens_table(tmp_path / "tokens.parquet", rows)
    sides = [split_of(doc_id, 0.5, "seed") for doc_id, _ in rows]
    assert set(sides) == {TRAIN, VALIDATION}
    with open(tmp_path / "train.bin", "wb") as train, open(tmp_path / "validation.bin", "wb") as validation:
        counts = write_split_tokens(
            tmp_path / "tokens.parquet", 0.5, "seed", 3, {TRAIN: train, VALIDATION: validation}, "uint32"
        )
    for side in (TRAIN, VALIDATION):
        ids = [token for (_, tokens), s in zip(rows, sides) if s == side for token in tokens]
        assert (tmp_path / f"{side}.bin").read_bytes() == b"".join(t.to_bytes(4, "little") for t in ids)
        assert counts[f"{side}_rows"] == sides.count(side)
        assert counts[f"{side}_tokens"] == 3 * sides.count(side)


def test_write_split_tokens_refuses_ids_its_dtype_cannot_hold(tmp_path: Path) -> None:
    write_tokens_table(tmp_path / "tokens.parquet", [("doc-0", [5, 65_536, 1])])
    with open(tmp_path / "train.bin", "wb") as train, open(tmp_path / "validation.bin", "wb") as validation:
        with pytest.raises(ValueError, match=r"token ids outside 0..65535, the range of uint16"):
            write_split_tokens(
                tmp_path / "tokens.parquet", 0.5, "seed", 64, {TRAIN: train, VALIDATION: validation}, "uint16"
            )


def test_rebuild_is_reused(built_demo: BuiltHome, copy_home) -> None:
    store = ArtifactStore(copy_home(built_demo))
    again = build_dataset_manifest(store, built_demo.config)
    assert again.reused and again.id == built_demo.dataset.id
    assert store.current(KIND).id == built_demo.dataset.id


def test_stale_tokenization_names_the_partitions(built_demo: BuiltHome, copy_home) -> None:
    store = ArtifactStore(copy_home(built_demo))
    config = built_demo.config
    retrained_config = config.model_copy(update={"tokenizer": config.tokenizer.model_copy(update={"vocab_size": 600})})
    retrained = build_bpe_tokenizer(store, retrained_config)
    assert retrained.id != built_demo.tokenizer.id
    with pytest.raises(StaleTokenization) as info:
        build_dataset_manifest(store, retrained_config)
    message = str(info.value)
    for partition in DEMO_PARTITIONS:
        assert partition in message
    assert retrained.id in message

    build_tokenized_documents(store, retrained_config, "2026-01-02")
    with pytest.raises(StaleTokenization) as info:
        build_dataset_manifest(store, retrained_config)
    message = str(info.value)
    assert "2026-01-01" in message and "2026-01-03" in message and "2026-01-02" not in message

    for partition in ("2026-01-01", "2026-01-03"):
        build_tokenized_documents(store, retrained_config, partition)
    dataset = build_dataset_manifest(store, retrained_config)
    assert dataset.id != built_demo.dataset.id
    assert read_dataset(dataset)["tokenizer_id"] == retrained.id
    assert dataset.content_sha256 != built_demo.dataset.content_sha256


def test_needs_a_tokenizer_and_tokenized_partitions(
    store: ArtifactStore, tiny_config, built_demo: BuiltHome, copy_home
) -> None:
    with pytest.raises(ArtifactNotFound, match="bpe_tokenizer"):
        build_dataset_manifest(store, tiny_config)
    home = copy_home(built_demo)
    shutil.rmtree(home / "refs" / "tokenized_documents")
    with pytest.raises(ArtifactNotFound, match="tokenized_documents"):
        build_dataset_manifest(ArtifactStore(home), tiny_config)
