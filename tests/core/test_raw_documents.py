"""raw_documents: an immutable, hashed snapshot of one day's landed files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.empty_day import has_no_data
from aieng_core.data.raw_documents import (
    FILES_DIR,
    KIND,
    MissingPartitionData,
    build_raw_documents,
    landed_files,
    readable,
    snapshot_files,
    snapshot_names,
)
from aieng_core.hashing import sha256_bytes
from aieng_core.home import parse_partition, raw_partition_dir
from aieng_core.store import ArtifactStore
from tests.conftest import land
from tests.core.helpers import jsonl, read_table

PARTITION = "2026-01-07"
DOC = {"id": "a", "text": "A landed document of some length."}


def test_missing_partition_folder(store: ArtifactStore, home: Path, tiny_config) -> None:
    folder = home / "raw" / PARTITION
    with pytest.raises(MissingPartitionData, match="does not exist") as info:
        build_raw_documents(store, tiny_config, PARTITION)
    assert str(folder) in str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert store.current(KIND, PARTITION) is None and not (store.root / KIND).exists()


def assert_empty_day(artifact, landing: str, ignored: list[str]) -> None:
    assert artifact.metrics == {"files": 0, "bytes": 0, "no_data": True, "landing_folder": landing}
    assert artifact.manifest["sources"] == [] and artifact.manifest["ignored_files"] == ignored
    assert has_no_data(artifact)


def test_folder_without_data_files_is_an_empty_day(store: ArtifactStore, home: Path, tiny_config) -> None:
    land(home, PARTITION, "README.txt", b"notes")
    land(home, PARTITION, ".hidden.jsonl", jsonl(DOC))
    (home / "raw" / PARTITION / "subdir.jsonl").mkdir()
    artifact = build_raw_documents(store, tiny_config, PARTITION)
    assert_empty_day(artifact, "empty", [".hidden.jsonl", "README.txt", "subdir.jsonl"])
    assert store.require_current(KIND, PARTITION).id == artifact.id
    assert store.verify(artifact) == []


def test_empty_folder_is_an_empty_day(store: ArtifactStore, home: Path, tiny_config) -> None:
    (home / "raw" / PARTITION).mkdir(parents=True)
    assert_empty_day(build_raw_documents(store, tiny_config, PARTITION), "empty", [])


def test_missing_folder_inside_a_range_is_recorded_absent(store: ArtifactStore, home: Path, tiny_config) -> None:
    absent = build_raw_documents(store, tiny_config, PARTITION, absent_ok=True)
    assert_empty_day(absent, "absent", [])
    (home / "raw" / PARTITION).mkdir(parents=True)
    empty = build_raw_documents(store, tiny_config, PARTITION)
    assert empty.id != absent.id  # two different facts about the day
    assert store.require_current(KIND, PARTITION).id == empty.id


def test_sources_list_every_landed_file(store: ArtifactStore, home: Path, tiny_config) -> None:
    contents = {
        "b.csv": b"id,text\nb,A second document here.\n",
        "a.jsonl": jsonl(DOC),
        "c.jsonl.gz": b"\x1f\x8b not really gzip",
        "notes.md": b"# ignored",
        ".in-flight.jsonl.tmp-123": b"partial",
    }
    for name, data in contents.items():
        land(home, PARTITION, name, data)
    artifact = build_raw_documents(store, tiny_config, PARTITION)
    folder = home / "raw" / PARTITION
    assert artifact.manifest["sources"] == [
        {
            "path": str(folder / name),
            "name": name,
            "size": len(contents[name]),
            "sha256": sha256_bytes(contents[name]),
            "mtime_ns": (folder / name).stat().st_mtime_ns,
        }
        for name in ("a.jsonl", "b.csv", "c.jsonl.gz")
    ]
    assert artifact.manifest["ignored_files"] == [".in-flight.jsonl.tmp-123", "notes.md"]
    assert artifact.metrics == {
        "files": 3,
        "bytes": sum(len(contents[n]) for n in ("a.jsonl", "b.csv", "c.jsonl.gz")),
        "no_data": False,
        "landing_folder": "landed",
    }
    assert sorted(artifact.manifest["files"]) == [
        f"{FILES_DIR}/a.jsonl",
        f"{FILES_DIR}/b.csv",
        f"{FILES_DIR}/c.jsonl.gz",
    ]
    for name in ("a.jsonl", "b.csv", "c.jsonl.gz"):
        assert (artifact.path / FILES_DIR / name).read_bytes() == contents[name]  # byte for byte
    assert [name for name, _ in snapshot_files(artifact)] == ["a.jsonl", "b.csv", "c.jsonl.gz"]
    assert store.verify(artifact) == []
    assert artifact.manifest["inputs"] == []


def test_same_files_are_reused_and_a_changed_byte_is_a_new_snapshot(
    store: ArtifactStore, home: Path, tiny_config
) -> None:
    path = land(home, PARTITION, "a.jsonl", jsonl(DOC))
    first = build_raw_documents(store, tiny_config, PARTITION)
    again = build_raw_documents(store, tiny_config, PARTITION)
    assert again.reused and again.id == first.id
    path.write_bytes(jsonl({"id": "a", "text": "A landed document of some lengtH."}))
    changed = build_raw_documents(store, tiny_config, PARTITION)
    assert changed.id != first.id and not changed.reused
    assert changed.content_sha256 != first.content_sha256
    land(home, PARTITION, "b.jsonl", jsonl(DOC))
    added = build_raw_documents(store, tiny_config, PARTITION)
    assert added.id not in (first.id, changed.id)
    assert store.verify(store.get(KIND, first.id)) == []  # old snapshots stay intact


def test_id_and_hash_do_not_depend_on_mtime_or_home(tmp_path: Path, tiny_config) -> None:
    ids = []
    for n, mtime in enumerate((1_000_000_000, 1_700_000_000)):
        home = tmp_path / f"home-{n}"
        path = land(home, PARTITION, "a.jsonl", jsonl(DOC))
        os.utime(path, (mtime, mtime))
        artifact = build_raw_documents(ArtifactStore(home), tiny_config, PARTITION)
        ids.append((artifact.id, artifact.content_sha256))
    assert ids[0] == ids[1]


def test_cleaning_reads_the_snapshot_not_the_landing_folder(store: ArtifactStore, home: Path, tiny_config) -> None:
    path = land(home, PARTITION, "a.jsonl", jsonl(DOC))
    build_raw_documents(store, tiny_config, PARTITION)
    path.write_bytes(jsonl({"id": "z", "text": "Edited after the snapshot was taken."}))
    clean = build_clean_documents(store, tiny_config, PARTITION)
    assert [row["id"] for row in read_table(clean.file("clean.parquet"))] == ["a"]
    path.unlink()
    assert build_clean_documents(store, tiny_config, PARTITION).reused


def test_landed_files_sorted_by_name(home: Path) -> None:
    for name in ("c.parquet", "a.csv.gz", "b.jsonl"):
        land(home, PARTITION, name, b"x")
    files, ignored = landed_files(home, PARTITION)
    assert [p.name for p in files] == ["a.csv.gz", "b.jsonl", "c.parquet"]
    assert ignored == []


@pytest.mark.parametrize("bad", ["2026-1-7", "20260107", "2026-02-30", "latest", "../2026-01-07", ""])
def test_partition_keys_must_be_dates(home: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        parse_partition(bad)
    with pytest.raises(ValueError):
        raw_partition_dir(home, bad)


# ---- hostile landing folders ----------------------------------------------------------------


def test_symlinks_and_special_files_are_never_followed(
    store: ArtifactStore, home: Path, tmp_path: Path, tiny_config
) -> None:
    land(home, PARTITION, "a.jsonl", jsonl(DOC))
    folder = home / "raw" / PARTITION
    secret = tmp_path / "elsewhere" / "secret.jsonl"
    secret.parent.mkdir()
    secret.write_bytes(jsonl({"id": "secret", "text": "Outside the landing folder entirely."}))
    (folder / "link.jsonl").symlink_to(secret)
    (folder / "dir.jsonl").symlink_to(secret.parent, target_is_directory=True)
    (folder / "dangling.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    os.mkfifo(folder / "pipe.jsonl")  # opening it to read would hang
    artifact = build_raw_documents(store, tiny_config, PARTITION)
    assert [source["name"] for source in artifact.manifest["sources"]] == ["a.jsonl"]
    assert artifact.manifest["ignored_files"] == ["dangling.jsonl", "dir.jsonl", "link.jsonl", "pipe.jsonl"]
    assert sorted(artifact.manifest["files"]) == [f"{FILES_DIR}/a.jsonl"]
    assert store.verify(artifact) == []


def test_a_folder_of_only_symlinks_holds_no_data(store: ArtifactStore, home: Path, tmp_path: Path, tiny_config) -> None:
    target = tmp_path / "real.jsonl"
    target.write_bytes(jsonl(DOC))
    folder = home / "raw" / PARTITION
    folder.mkdir(parents=True)
    (folder / "a.jsonl").symlink_to(target)
    assert_empty_day(build_raw_documents(store, tiny_config, PARTITION), "empty", ["a.jsonl"])


def land_bytes_name(home: Path, partition: str, name: bytes, data: bytes) -> None:
    """Land a file whose name is raw bytes, as a program writing non-UTF-8 names would."""
    folder = home / "raw" / partition
    folder.mkdir(parents=True, exist_ok=True)
    with open(os.path.join(os.fsencode(folder), name), "wb") as handle:
        handle.write(data)


def test_a_name_that_is_not_utf8_is_snapshotted_and_read(store: ArtifactStore, home: Path, tiny_config) -> None:
    latin1 = {"id": "latin1-name", "text": "Landed under a Latin-1 file name."}
    taken = {"id": "percent-name", "text": "Landed under the name the escape would pick."}
    land_bytes_name(home, PARTITION, b"caf\xe9.jsonl", jsonl(latin1))
    land_bytes_name(home, PARTITION, b"caf%E9.jsonl", jsonl(taken))
    land_bytes_name(home, PARTITION, b"\xff\xfe.jsonl.gz", b"\x1f\x8b not really gzip")
    land_bytes_name(home, PARTITION, b"notes\xe9.md", b"ignored")
    artifact = build_raw_documents(store, tiny_config, PARTITION)
    folder = str(home / "raw" / PARTITION)
    sources = {source["path"]: source["name"] for source in artifact.manifest["sources"]}
    assert sources == {
        f"{folder}/caf\\xe9.jsonl": "caf%E9~2.jsonl",  # "caf%E9.jsonl" is taken by a landed file
        f"{folder}/caf%E9.jsonl": "caf%E9.jsonl",
        f"{folder}/\\xff\\xfe.jsonl.gz": "%FF%FE.jsonl.gz",
    }
    assert artifact.manifest["ignored_files"] == ["notes\\xe9.md"]
    json.loads((artifact.path / "manifest.json").read_text(encoding="utf-8"))  # valid UTF-8 JSON
    files = snapshot_files(artifact)
    assert [name for name, _ in files] == ["%FF%FE.jsonl.gz", "caf%E9.jsonl", "caf%E9~2.jsonl"]
    assert (artifact.path / FILES_DIR / "caf%E9~2.jsonl").read_bytes() == jsonl(latin1)
    assert store.verify(artifact) == []
    assert build_raw_documents(store, tiny_config, PARTITION).reused

    clean = build_clean_documents(store, tiny_config, PARTITION)
    rows = {row["id"]: row["source_file"] for row in read_table(clean.file("clean.parquet"))}
    assert rows == {"latin1-name": "caf%E9~2.jsonl", "percent-name": "caf%E9.jsonl"}


def test_readable_names_are_unambiguous() -> None:
    assert readable("plain name.jsonl") == "plain name.jsonl"
    assert readable(os.fsdecode(b"caf\xe9.jsonl")) == "caf\\xe9.jsonl"
    assert readable("caf\\xe9.jsonl") == "caf\\\\xe9.jsonl"  # a literal backslash is not an escape
    assert readable(Path(os.fsdecode(b"/raw/\xff/a.csv"))) == "/raw/\\xff/a.csv"


def test_snapshot_names_stay_unique() -> None:
    landed = [
        Path(os.fsdecode(name))
        for name in (b"a\xe9.csv", b"a\xe9\xe9.csv", b"a%E9.csv", b"a%E9~2.csv", b"b\xe9.csv.gz")
    ]
    assert snapshot_names(landed) == ["a%E9~3.csv", "a%E9%E9.csv", "a%E9.csv", "a%E9~2.csv", "b%E9.csv.gz"]
