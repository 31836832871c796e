"""The artifact store: atomic appearance, reuse, recipe ids, verification, damage handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aieng_core.hashing import sha256_bytes, sha256_file
from aieng_core.store import (
    ArtifactIntegrityError,
    ArtifactNotFound,
    ArtifactSpec,
    ArtifactStore,
    Produced,
    RunInfo,
)
from aieng_core.store.artifacts import MANIFEST

PARTITION = "2026-01-01"
MANIFEST_KEYS = {
    "kind",
    "id",
    "created_at",
    "code_version",
    "config_sha256",
    "git_commit",
    "libraries",
    "dagster_run_id",
    "inputs",
    "files",
    "metrics",
    "content_sha256",
}


def spec(**changes) -> ArtifactSpec:
    fields = dict(
        kind="thing",
        code_version="thing-v1",
        config_sha256="c" * 64,
        partition=PARTITION,
        inputs=(("upstream", "up-1"),),
        recipe={"sources": ["a"]},
    )
    fields.update(changes)
    return ArtifactSpec(**fields)


class Producer:
    """A builder that writes two files (one nested) and counts its calls."""

    def __init__(self, payload: bytes = b"hello artifact\n") -> None:
        self.payload = payload
        self.calls = 0

    def __call__(self, staging: Path) -> Produced:
        self.calls += 1
        (staging / "data.bin").write_bytes(self.payload)
        (staging / "sub").mkdir()
        (staging / "sub" / "more.txt").write_text("nested\n")
        return Produced(content_sha256=sha256_bytes(self.payload), metrics={"bytes": len(self.payload)})


def leftovers(store: ArtifactStore, kind: str = "thing") -> list[str]:
    """Every entry in the kind's folder: artifacts, temp dirs, moved-aside copies."""
    folder = store.root / kind
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_build_writes_files_and_a_complete_manifest(store: ArtifactStore) -> None:
    produce = Producer()
    artifact = store.build(spec(), produce, RunInfo(dagster_run_id="run-123"))
    assert produce.calls == 1 and artifact.reused is False
    assert artifact.path == store.root / "thing" / artifact.id
    assert artifact.id.startswith(f"{PARTITION}-")
    manifest = json.loads((artifact.path / MANIFEST).read_text())
    assert MANIFEST_KEYS <= set(manifest)
    assert manifest == artifact.manifest
    assert manifest["kind"] == "thing" and manifest["id"] == artifact.id
    assert manifest["code_version"] == "thing-v1"
    assert manifest["config_sha256"] == "c" * 64
    assert manifest["dagster_run_id"] == "run-123"
    assert manifest["inputs"] == [{"kind": "upstream", "id": "up-1"}]
    assert manifest["files"] == {
        "data.bin": sha256_file(artifact.path / "data.bin"),
        "sub/more.txt": sha256_file(artifact.path / "sub" / "more.txt"),
    }
    assert manifest["metrics"] == {"bytes": len(produce.payload)}
    assert artifact.content_sha256 == sha256_bytes(produce.payload)
    assert manifest["created_at"].endswith("+00:00")
    assert manifest["git_commit"] is None or isinstance(manifest["git_commit"], str)
    assert store.verify(artifact) == []
    assert leftovers(store) == [artifact.id]


def test_build_sets_the_current_pointer(store: ArtifactStore) -> None:
    assert store.current("thing", PARTITION) is None
    with pytest.raises(ArtifactNotFound, match=PARTITION):
        store.require_current("thing", PARTITION)
    artifact = store.build(spec(), Producer())
    assert store.current("thing", PARTITION).id == artifact.id
    assert store.require_current("thing", PARTITION).manifest == artifact.manifest
    assert store.current_partitions("thing") == [PARTITION]
    unpartitioned = store.build(spec(partition=None), Producer())
    assert "-" not in unpartitioned.id
    assert store.current("thing").id == unpartitioned.id
    assert store.current_partitions("thing") == [PARTITION]  # the unpartitioned ref is not a partition
    assert store.find(unpartitioned.id).path == unpartitioned.path
    assert store.list_ids("thing") == sorted([artifact.id, unpartitioned.id])


def test_unchanged_recipe_is_reused_without_producing(store: ArtifactStore) -> None:
    first = store.build(spec(), Producer())
    produce = Producer(b"different bytes would be written\n")
    second = store.build(spec(), produce, RunInfo(dagster_run_id="another-run"))
    assert produce.calls == 0
    assert second.reused is True
    assert second.id == first.id and second.path == first.path
    assert second.manifest == first.manifest  # the first run's manifest, run id included
    assert (second.path / "data.bin").read_bytes() == b"hello artifact\n"
    assert leftovers(store) == [first.id]


def test_reuse_moves_the_current_pointer_back(store: ArtifactStore) -> None:
    first = store.build(spec(), Producer())
    other = store.build(spec(config_sha256="d" * 64), Producer())
    assert store.current("thing", PARTITION).id == other.id
    again = store.build(spec(), Producer())
    assert again.reused and again.id == first.id
    assert store.current("thing", PARTITION).id == first.id


@pytest.mark.parametrize(
    "change",
    [
        {"code_version": "thing-v2"},
        {"config_sha256": "d" * 64},
        {"inputs": (("upstream", "up-2"),)},
        {"inputs": (("upstream", "up-1"), ("other", "x"))},
        {"recipe": {"sources": ["b"]}},
        {"partition": "2026-01-02"},
        {"kind": "other_thing"},
    ],
)
def test_changed_recipe_gives_a_new_id(store: ArtifactStore, change: dict) -> None:
    first = store.build(spec(), Producer())
    produce = Producer()
    changed = store.build(spec(**change), produce)
    assert changed.id != first.id
    assert produce.calls == 1 and changed.reused is False
    assert store.verify(first) == []  # the old artifact is untouched


def test_run_info_is_not_part_of_the_identity(store: ArtifactStore) -> None:
    a = store.build(spec(), Producer(), RunInfo("run-a"))
    b = store.build(spec(), Producer(), RunInfo("run-b"))
    assert a.id == b.id and b.reused


def test_failing_builder_leaves_nothing_behind(store: ArtifactStore) -> None:
    def explode(staging: Path) -> Produced:
        (staging / "half.bin").write_bytes(b"half written")
        raise RuntimeError("builder died")

    with pytest.raises(RuntimeError, match="builder died"):
        store.build(spec(), explode)
    assert leftovers(store) == []
    assert store.current("thing", PARTITION) is None
    assert not (store.refs / "thing").exists() or list((store.refs / "thing").iterdir()) == []


def test_interrupted_builder_leaves_nothing_behind(store: ArtifactStore) -> None:
    def interrupted(staging: Path) -> Produced:
        (staging / "half.bin").write_bytes(b"half written")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.build(spec(), interrupted)
    assert leftovers(store) == []


def test_failing_rebuild_keeps_the_previous_artifact_and_pointer(store: ArtifactStore) -> None:
    previous = store.build(spec(), Producer())
    ref = store.refs / "thing" / f"{PARTITION}.json"
    ref_before = ref.read_bytes()

    def explode(staging: Path) -> Produced:
        (staging / "data.bin").write_bytes(b"new data")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store.build(spec(code_version="thing-v2"), explode)
    assert leftovers(store) == [previous.id]
    assert ref.read_bytes() == ref_before
    assert store.current("thing", PARTITION).id == previous.id
    assert store.verify(store.get("thing", previous.id)) == []
    assert sorted(p.name for p in ref.parent.iterdir()) == [ref.name]  # no temp ref files


def test_builder_may_not_write_the_manifest(store: ArtifactStore) -> None:
    def cheat(staging: Path) -> Produced:
        (staging / MANIFEST).write_text("{}")
        return Produced(content_sha256="0" * 64)

    with pytest.raises(RuntimeError, match=MANIFEST):
        store.build(spec(), cheat)
    assert leftovers(store) == []


def test_concurrent_writer_of_the_same_recipe_wins_and_is_reused(store: ArtifactStore) -> None:
    """If the target appears while we write (another process finished first), we reuse it."""
    inner = Producer(b"written by the other writer\n")

    def racing(staging: Path) -> Produced:
        store.build(spec(), inner)  # the other writer completes the same recipe first
        (staging / "data.bin").write_bytes(b"ours")
        return Produced(content_sha256="0" * 64)

    artifact = store.build(spec(), racing)
    assert inner.calls == 1
    assert artifact.reused is True
    assert (artifact.path / "data.bin").read_bytes() == b"written by the other writer\n"
    assert leftovers(store) == [artifact.id]
    assert store.current("thing", PARTITION).id == artifact.id


def test_verify_detects_a_tampered_file(store: ArtifactStore) -> None:
    artifact = store.build(spec(), Producer())
    (artifact.path / "data.bin").write_bytes(b"hello artifacT\n")
    problems = store.verify(artifact)
    assert len(problems) == 1 and "data.bin" in problems[0] and "sha256" in problems[0]
    with pytest.raises(ArtifactIntegrityError, match="data.bin"):
        store.check(artifact)


def test_verify_detects_a_missing_file(store: ArtifactStore) -> None:
    artifact = store.build(spec(), Producer())
    (artifact.path / "sub" / "more.txt").unlink()
    problems = store.verify(artifact)
    assert len(problems) == 1 and "more.txt" in problems[0] and "missing" in problems[0]


def test_verify_detects_an_extra_file(store: ArtifactStore) -> None:
    artifact = store.build(spec(), Producer())
    (artifact.path / "sub" / "sneaky.bin").write_bytes(b"x")
    problems = store.verify(artifact)
    assert len(problems) == 1 and "sneaky.bin" in problems[0] and "not listed" in problems[0]


@pytest.mark.parametrize("damage", ["tamper", "delete", "extra"])
def test_damaged_artifact_is_moved_aside_and_rebuilt(store: ArtifactStore, damage: str) -> None:
    artifact = store.build(spec(), Producer())
    if damage == "tamper":
        (artifact.path / "data.bin").write_bytes(b"tampered")
    elif damage == "delete":
        (artifact.path / "data.bin").unlink()
    else:
        (artifact.path / "extra.bin").write_bytes(b"extra")
    produce = Producer()
    rebuilt = store.build(spec(), produce)
    assert produce.calls == 1 and rebuilt.reused is False
    assert rebuilt.id == artifact.id
    assert store.verify(rebuilt) == []
    assert (rebuilt.path / "data.bin").read_bytes() == b"hello artifact\n"
    entries = leftovers(store)
    aside = [name for name in entries if name.startswith(f".damaged-{artifact.id}-")]
    assert len(aside) == 1 and sorted(entries) == sorted([artifact.id, aside[0]])
    kept = store.root / "thing" / aside[0]
    if damage == "tamper":
        assert (kept / "data.bin").read_bytes() == b"tampered"  # kept for inspection, not deleted
    elif damage == "delete":
        assert not (kept / "data.bin").exists() and (kept / MANIFEST).is_file()
    else:
        assert (kept / "extra.bin").read_bytes() == b"extra"
    assert store.list_ids("thing") == [artifact.id]  # the moved-aside copy is not an artifact


def test_get_and_find_errors(store: ArtifactStore) -> None:
    with pytest.raises(ArtifactNotFound):
        store.get("thing", "no-such-id")
    with pytest.raises(ArtifactNotFound):
        store.find("no-such-id")
    for bad in ("", "../etc", ".hidden", "a/b"):
        with pytest.raises(ArtifactNotFound):
            store.artifact_dir("thing", bad)
    artifact = store.build(spec(), Producer())
    (artifact.path / MANIFEST).write_text("{not json")
    with pytest.raises(ArtifactIntegrityError, match="unreadable manifest"):
        store.get("thing", artifact.id)


@pytest.mark.parametrize("damage", ["corrupt manifest", "delete manifest"])
def test_artifact_with_a_damaged_manifest_is_moved_aside_and_rebuilt(store: ArtifactStore, damage: str) -> None:
    artifact = store.build(spec(), Producer())
    if damage == "corrupt manifest":
        (artifact.path / MANIFEST).write_text('{"kind": "thi')
    else:
        (artifact.path / MANIFEST).unlink()
    produce = Producer()
    rebuilt = store.build(spec(), produce)
    assert produce.calls == 1 and rebuilt.reused is False
    assert store.verify(store.get("thing", artifact.id)) == []
    entries = leftovers(store)
    assert artifact.id in entries
    assert len([name for name in entries if name.startswith(f".damaged-{artifact.id}-")]) == 1


def test_manifest_records_the_library_versions_that_decide_its_content(store: ArtifactStore) -> None:
    from importlib import metadata

    artifact = store.build(spec(), Producer())
    libraries = artifact.manifest["libraries"]
    assert set(libraries) == {
        "python",
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "pyarrow",
        "numpy",
        "pydantic",
        "dagster",
    }
    assert libraries["torch"] == metadata.version("torch")
    assert libraries["dagster"] == metadata.version("dagster")
    assert libraries["tokenizers"] == metadata.version("tokenizers")
