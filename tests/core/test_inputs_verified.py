"""One id, one content: a step verifies what it builds from, refuses superseded inputs, and
rebuilds a damaged pinned tokenizer under its own recipe."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.dataset.dataset_manifest import StaleTokenization, build_dataset_manifest
from aieng_core.store import ArtifactStore, DamagedInput
from aieng_core.tokenizer.bpe_tokenizer import build_bpe_tokenizer
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents
from tests.conftest import land
from tests.core.helpers import BuiltHome, jsonl

PARTITION = "2026-01-02"


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def forget(store: ArtifactStore, kind: str, artifact_id: str) -> None:
    """Remove a downstream artifact, so that the next build must produce it again."""
    shutil.rmtree(store.root / kind / artifact_id)


def test_clean_documents_refuses_a_damaged_raw_snapshot(built_demo: BuiltHome, copy_home) -> None:
    store = ArtifactStore(copy_home(built_demo))
    raw, clean = built_demo.raw[PARTITION], built_demo.clean[PARTITION]
    snapshot = next((store.root / "raw_documents" / raw.id / "files").iterdir())
    damage(snapshot)
    forget(store, "clean_documents", clean.id)
    with pytest.raises(DamagedInput) as error:
        build_clean_documents(store, built_demo.config, PARTITION)
    message = str(error.value)
    assert snapshot.name in message and "sha256 does not match" in message
    assert f"--select raw_documents --partition {PARTITION}" in message
    assert not (store.root / "clean_documents" / clean.id).exists()  # nothing wrong was published


def test_tokenized_documents_refuses_damaged_clean_text(built_demo: BuiltHome, copy_home) -> None:
    store = ArtifactStore(copy_home(built_demo))
    damage(store.root / "clean_documents" / built_demo.clean[PARTITION].id / "clean.parquet")
    forget(store, "tokenized_documents", built_demo.tokenized[PARTITION].id)
    with pytest.raises(DamagedInput, match=f"clean.parquet.*--select clean_documents --partition {PARTITION}"):
        build_tokenized_documents(store, built_demo.config, PARTITION)


def test_dataset_manifest_refuses_damaged_tokens(built_demo: BuiltHome, copy_home) -> None:
    store = ArtifactStore(copy_home(built_demo))
    damage(store.root / "tokenized_documents" / built_demo.tokenized[PARTITION].id / "tokens.parquet")
    forget(store, "dataset_manifest", built_demo.dataset.id)
    with pytest.raises(DamagedInput, match="tokens.parquet.*--select tokenized_documents"):
        build_dataset_manifest(store, built_demo.config)


def test_a_rebuilt_input_has_its_recipe_id_and_the_downstream_step_goes_on(built_demo: BuiltHome, copy_home) -> None:
    store = ArtifactStore(copy_home(built_demo))
    clean = built_demo.clean[PARTITION]
    damage(store.root / "clean_documents" / clean.id / "clean.parquet")
    forget(store, "tokenized_documents", built_demo.tokenized[PARTITION].id)
    rebuilt = build_clean_documents(store, built_demo.config, PARTITION)  # what the message says to run
    assert (rebuilt.id, rebuilt.reused, rebuilt.content_sha256) == (clean.id, False, clean.content_sha256)
    assert any(p.name.startswith(f".damaged-{clean.id}") for p in (store.root / "clean_documents").iterdir())
    tokenized = build_tokenized_documents(store, built_demo.config, PARTITION)
    assert (tokenized.id, tokenized.content_sha256) == (
        built_demo.tokenized[PARTITION].id,
        built_demo.tokenized[PARTITION].content_sha256,
    )


def test_dataset_manifest_refuses_tokens_from_superseded_clean_text(built_demo: BuiltHome, copy_home) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    land(
        home,
        PARTITION,
        "late.jsonl",
        jsonl({"id": "late-1", "text": "A document that landed after the day was built."}),
    )
    build_raw_documents(store, built_demo.config, PARTITION)
    build_clean_documents(store, built_demo.config, PARTITION)  # a new clean artifact; tokens not redone
    with pytest.raises(StaleTokenization) as error:
        build_dataset_manifest(store, built_demo.config)
    message = str(error.value)
    assert PARTITION in message and "clean_documents" in message
    assert f"--select tokenized_documents --partition-range {PARTITION}...{PARTITION}" in message
    build_tokenized_documents(store, built_demo.config, PARTITION)
    assert build_dataset_manifest(store, built_demo.config).id != built_demo.dataset.id


def test_a_damaged_pinned_tokenizer_is_rebuilt_under_its_own_id(built_demo: BuiltHome, copy_home) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    tokenizer = built_demo.tokenizer
    original = (store.root / "bpe_tokenizer" / tokenizer.id / "tokenizer.json").read_bytes()
    # A new day's clean text exists: a fresh training would give another tokenizer and id.
    land(
        home,
        "2026-01-04",
        "new.jsonl",
        jsonl({"id": "n1", "text": "Brand new vocabulary: zyzzyva quixotic xylophone."}),
    )
    build_raw_documents(store, built_demo.config, "2026-01-04")
    build_clean_documents(store, built_demo.config, "2026-01-04")
    damage(store.root / "bpe_tokenizer" / tokenizer.id / "tokenizer.json")
    rebuilt = build_bpe_tokenizer(store, built_demo.config)
    assert (rebuilt.id, rebuilt.reused) == (tokenizer.id, False)
    assert (rebuilt.path / "tokenizer.json").read_bytes() == original  # same id, same bytes
    assert store.current("bpe_tokenizer").id == tokenizer.id
    assert any(p.name.startswith(f".damaged-{tokenizer.id}") for p in (store.root / "bpe_tokenizer").iterdir())
