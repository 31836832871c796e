"""The store never reads outside itself, whatever a hand-edited ref or manifest says."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from aieng_core.hashing import sha256_bytes, sha256_file
from aieng_core.store import ArtifactIntegrityError, ArtifactNotFound, ArtifactSpec, ArtifactStore, Produced
from aieng_core.store.artifacts import MANIFEST, InvalidArtifactName

PARTITION = "2026-01-01"
# None is missing here: as a partition it means "unpartitioned".
BAD_NAMES = [
    "",
    ".",
    "..",
    "a..b",
    "../x",
    "x/y",
    ".hidden",
    "-dash",
    "_under",
    "a b",
    "a\\b",
    "a\x00b",
    "café",
    "x" * 129,
    42,
]


def spec(**changes) -> ArtifactSpec:
    fields = dict(kind="thing", code_version="thing-v1", config_sha256="c" * 64, partition=PARTITION)
    fields.update(changes)
    return ArtifactSpec(**fields)


def produce(staging: Path) -> Produced:
    (staging / "data.bin").write_bytes(b"payload\n")
    (staging / "sub").mkdir()
    (staging / "sub" / "more.txt").write_bytes(b"nested\n")
    return Produced(content_sha256=sha256_bytes(b"payload\n"))


def rewrite_manifest(path: Path, **changes) -> dict:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest.update(changes)
    (path / MANIFEST).write_text(json.dumps(manifest))
    return manifest


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_bad_ids_and_kinds_are_refused_before_any_path_is_built(store: ArtifactStore, bad) -> None:
    for call in (
        lambda: store.artifact_dir("thing", bad),
        lambda: store.artifact_dir(bad, "abc"),
        lambda: store.get("thing", bad),
        lambda: store.find(bad),
        lambda: store.current(bad),
        lambda: store.current("thing", bad),
    ):
        with pytest.raises(InvalidArtifactName, match="invalid") as info:
            call()
        assert repr(bad) in str(info.value)
        assert isinstance(info.value, ArtifactNotFound) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad_id", ["../../outside", "..", "a..b", 42, None])
def test_a_hand_edited_ref_cannot_point_outside_the_store(store: ArtifactStore, bad_id) -> None:
    artifact = store.build(spec(), produce)
    ref = store.refs / "thing" / f"{PARTITION}.json"
    record = json.loads(ref.read_text())
    ref.write_text(json.dumps({**record, "id": bad_id}))
    with pytest.raises(InvalidArtifactName, match=re.escape(repr(bad_id))):
        store.current("thing", PARTITION)
    ref.write_text("{not json")
    with pytest.raises(ArtifactIntegrityError, match="unreadable ref"):
        store.current("thing", PARTITION)
    assert store.verify(artifact) == []


def test_listings_skip_names_that_are_not_valid(store: ArtifactStore) -> None:
    artifact = store.build(spec(), produce)
    odd = store.root / "thing" / "odd name"
    odd.mkdir()
    (odd / MANIFEST).write_text("{}")
    (store.refs / "thing" / "odd name.json").write_text(json.dumps({"id": artifact.id}))
    assert store.list_ids("thing") == [artifact.id]
    assert store.current_partitions("thing") == [PARTITION]


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("../outside.bin", "'..'"),
        ("sub/../../outside.bin", "'..'"),
        ("./data.bin", "'.'"),
        ("sub//more.txt", "empty"),
        ("{outside}", "absolute"),
        ("sub\\more.txt", "backslash"),
        ("data.bin\x00", "NUL"),
    ],
)
def test_verify_reports_listed_names_that_leave_the_artifact(
    store: ArtifactStore, tmp_path: Path, key: str, why: str
) -> None:
    artifact = store.build(spec(), produce)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"outside the store\n")
    # Planted next to the artifact, with the right hash: a verify that followed the key
    # would read it and find nothing wrong.
    (artifact.path.parent / "outside.bin").write_bytes(outside.read_bytes())
    key = key.format(outside=outside)
    files = {**artifact.manifest["files"], key: sha256_file(outside)}
    problems = store.verify(store.get("thing", rewrite_manifest(artifact.path, files=files)["id"]))
    assert len(problems) == 1, problems
    assert repr(key) in problems[0] and why in problems[0] and "not read" in problems[0]


def test_verify_reports_a_symlink_to_a_file_even_with_the_right_content(store: ArtifactStore, tmp_path: Path) -> None:
    artifact = store.build(spec(), produce)
    outside = tmp_path / "copy.bin"
    outside.write_bytes((artifact.path / "data.bin").read_bytes())
    (artifact.path / "data.bin").unlink()
    (artifact.path / "data.bin").symlink_to(outside)
    problems = store.verify(artifact)
    assert any("'data.bin'" in p and "symbolic link" in p for p in problems), problems
    assert any(p.startswith(f"{artifact.path / 'data.bin'}: a symbolic link") for p in problems), problems


def test_verify_reports_a_symlinked_directory_and_does_not_descend(store: ArtifactStore, tmp_path: Path) -> None:
    artifact = store.build(spec(), produce)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "more.txt").write_bytes(b"nested\n")
    (elsewhere / "unlisted.bin").write_bytes(b"never looked at\n")
    (artifact.path / "sub" / "more.txt").unlink()
    (artifact.path / "sub").rmdir()
    (artifact.path / "sub").symlink_to(elsewhere, target_is_directory=True)
    problems = store.verify(artifact)
    assert len(problems) == 2, problems
    assert "'sub/more.txt'" in problems[0] and "symbolic link" in problems[0]
    assert problems[1] == f"{artifact.path / 'sub'}: a symbolic link inside the artifact"


def test_verify_reports_an_artifact_directory_that_is_a_symlink(store: ArtifactStore, tmp_path: Path) -> None:
    artifact = store.build(spec(), produce)
    moved = tmp_path / "moved"
    os.rename(artifact.path, moved)
    artifact.path.symlink_to(moved, target_is_directory=True)
    assert store.verify(store.get("thing", artifact.id)) == [
        f"{artifact.path}: the artifact directory is a symbolic link"
    ]


@pytest.mark.parametrize("make", ["file link", "dir link", "fifo"])
def test_build_refuses_a_builder_that_writes_a_link_or_a_special_file(
    store: ArtifactStore, tmp_path: Path, make: str
) -> None:
    target = tmp_path / "target"
    target.mkdir()

    def sneaky(staging: Path) -> Produced:
        produce(staging)
        if make == "file link":
            (staging / "link.bin").symlink_to(staging / "data.bin")
        elif make == "dir link":
            (staging / "link").symlink_to(target, target_is_directory=True)
        else:
            os.mkfifo(staging / "link.fifo")
        return Produced(content_sha256="0" * 64)

    with pytest.raises(RuntimeError, match="'link.*not a regular file"):
        store.build(spec(), sneaky)
    assert not (store.root / "thing").exists() or list((store.root / "thing").iterdir()) == []
