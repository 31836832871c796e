"""`aieng store verify [--gc] [--json]`, the staging ownership it relies on, and the fault points.

Writers that die are real processes killed by SIGKILL at a named crash point; a live writer is
a real process held at a named point (AIENG_PAUSE_AT) while the collector runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aieng_core.cli import main
from aieng_core.faults import armed_points, crash_point, parse_point
from aieng_core.hashing import sha256_bytes
from aieng_core.store import ArtifactSpec, ArtifactStore, Produced
from aieng_core.store.artifacts import MANIFEST
from aieng_core.store.atomic import (
    TargetExists,
    atomic_directory,
    atomic_write_bytes,
    owner_alive,
    remove_if_abandoned,
)
from aieng_core.store.verify import verify_store

REPO_ROOT = Path(__file__).resolve().parents[2]
KIND = "thing"
DEADLINE_S = 60.0

# A writer in its own process: builds one `thing` artifact (two files) in the store at argv[1].
WRITER = """
import sys
from pathlib import Path
from aieng_core.store import ArtifactSpec, ArtifactStore, Produced

def produce(staging: Path) -> Produced:
    (staging / "a.txt").write_text("first file\\n")
    (staging / "b.txt").write_text("second file\\n")
    return Produced(content_sha256="0" * 64)

spec = ArtifactSpec(kind="thing", code_version="thing-v1", config_sha256="c" * 64, recipe={"n": sys.argv[2]})
print(ArtifactStore(sys.argv[1]).build(spec, produce).id, flush=True)
"""


def build(store: ArtifactStore, name: str, partition: str | None = None) -> str:
    def produce(staging: Path) -> Produced:
        (staging / "data.txt").write_text(f"{name}\n")
        (staging / "sub").mkdir()
        (staging / "sub" / "more.txt").write_text("nested\n")
        return Produced(content_sha256=sha256_bytes(name.encode()))

    spec = ArtifactSpec(
        kind=KIND, code_version="thing-v1", config_sha256="c" * 64, partition=partition, recipe={"n": name}
    )
    return store.build(spec, produce).id


def writer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIENG_CRASH", "AIENG_PAUSE"))}
    return {**env, "PYTHONPATH": str(REPO_ROOT), **extra}


def run_writer(home: Path, name: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WRITER, str(home), name],
        env=writer_env(**env),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


@dataclass
class HeldWriter:
    process: subprocess.Popen[str]
    release: Path


@pytest.fixture
def held_writer(home: Path, tmp_path: Path) -> Iterator[HeldWriter]:
    """A writer process held after staging its artifact, before the rename (so it owns a staging dir)."""
    release = tmp_path / "release"
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(home), "held"],
        env=writer_env(AIENG_PAUSE_AT=f"artifact.staged:{KIND}", AIENG_PAUSE_FILE=str(release)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not list(tmp_path.glob("release.*.waiting")):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the writer never reached artifact.staged"
            time.sleep(0.02)
        yield HeldWriter(process, release)
    finally:
        release.touch()
        try:
            process.wait(timeout=DEADLINE_S)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def staging_dirs(home: Path) -> list[Path]:
    folder = home / "artifacts" / KIND
    return sorted(p for p in folder.iterdir() if ".tmp-" in p.name and p.is_dir())


# ---- a clean store ------------------------------------------------------------------------------
def test_an_intact_store_passes(store: ArtifactStore, home: Path) -> None:
    ids = [build(store, "one", "2026-01-01"), build(store, "two")]
    result = verify_store(home)
    assert result["ok"] is True
    assert result["artifacts_checked"] == 2
    assert (result["damaged"], result["bad_refs"], result["staging"], result["removed"]) == ([], [], [], [])
    assert result["stale_staging"] == 0
    assert sorted(ids) == sorted(p.name for p in (home / "artifacts" / KIND).iterdir())


def test_an_empty_home_passes_and_a_missing_one_is_an_error(home: Path, tmp_path: Path) -> None:
    assert verify_store(home)["ok"] is True and verify_store(home)["artifacts_checked"] == 0
    with pytest.raises(FileNotFoundError, match="does not exist"):
        verify_store(tmp_path / "nowhere")


# ---- damage ---------------------------------------------------------------------------------------
def test_a_changed_file_is_damage_and_so_is_its_ref(store: ArtifactStore, home: Path) -> None:
    artifact_id = build(store, "one", "2026-01-01")
    build(store, "two")
    (home / "artifacts" / KIND / artifact_id / "sub" / "more.txt").write_text("changed\n")
    result = verify_store(home)
    assert result["ok"] is False and result["artifacts_checked"] == 2
    [damaged] = result["damaged"]
    assert (damaged["kind"], damaged["id"]) == (KIND, artifact_id)
    assert damaged["problems"] == [
        f"{home / 'artifacts' / KIND / artifact_id / 'sub' / 'more.txt'}: sha256 does not match the manifest"
    ]
    [ref] = result["bad_refs"]
    assert ref["ref"] == str(home / "refs" / KIND / "2026-01-01.json")
    assert ref["problem"] == f"points at {KIND} {artifact_id}, which is damaged"


def test_a_missing_file_and_a_missing_manifest_are_damage(store: ArtifactStore, home: Path) -> None:
    first, second = build(store, "one"), build(store, "two")
    (home / "artifacts" / KIND / first / "data.txt").unlink()
    (home / "artifacts" / KIND / second / MANIFEST).unlink()
    result = verify_store(home)
    assert result["ok"] is False
    problems = {item["id"]: item["problems"] for item in result["damaged"]}
    assert problems[first] == [
        f"{home / 'artifacts' / KIND / first}: manifest lists 'data.txt', which is missing; not read"
    ]
    assert problems[second] == [f"{home / 'artifacts' / KIND / second / MANIFEST}: missing (never written completely)"]


def test_a_manifest_naming_another_artifact_is_damage(store: ArtifactStore, home: Path) -> None:
    first = build(store, "one")
    copy = home / "artifacts" / KIND / "copied-elsewhere"
    shutil.copytree(home / "artifacts" / KIND / first, copy)
    [damaged] = verify_store(home)["damaged"]
    assert damaged["id"] == "copied-elsewhere"
    assert damaged["problems"] == [f"{copy / MANIFEST}: names {KIND} {first}, not {KIND} copied-elsewhere"]


def test_a_dangling_or_unreadable_ref_is_bad(store: ArtifactStore, home: Path) -> None:
    build(store, "one", "2026-01-01")
    (home / "refs" / KIND / "2026-01-02.json").write_text(json.dumps({"kind": KIND, "id": "2026-01-02-gone"}))
    (home / "refs" / KIND / "2026-01-03.json").write_text("{not json")
    result = verify_store(home)
    assert result["ok"] is False and result["damaged"] == []
    bad = {ref["partition"]: ref for ref in result["bad_refs"]}
    assert sorted(bad) == ["2026-01-02", "2026-01-03"]
    assert bad["2026-01-02"]["id"] == "2026-01-02-gone"
    assert "no thing artifact '2026-01-02-gone'" in bad["2026-01-02"]["problem"]
    assert bad["2026-01-03"]["problem"].startswith("unreadable:")


def _pointer_state(pointer: str, bundle_id: str) -> dict:
    return {
        "pointer": pointer,
        "bundle_id": bundle_id,
        "bundle_path": f"/elsewhere/{bundle_id}",
        "sequence": 1,
        "updated_at": "2026-01-01T00:00:00.000+00:00",
        "stack": [],
    }


def test_a_deployment_pointer_to_a_missing_bundle_is_bad(home: Path) -> None:
    pointer = home / "deployments" / "production"
    pointer.mkdir(parents=True)
    (pointer / "current.json").write_text(json.dumps(_pointer_state("production", "abc123")))
    [ref] = verify_store(home)["bad_refs"]
    assert (ref["ref"], ref["id"], ref["problem"]) == (
        str(pointer / "current.json"),
        "abc123",
        "serving_bundle abc123 is not in the store",
    )


def test_a_deployment_pointer_is_read_as_every_reader_reads_it(home: Path) -> None:
    """store verify reads pointers through store/pointers.py, as deploy, lineage and the server
    do: a current.json they refuse (keys missing) or a damaged history line is damage here too."""
    incomplete = home / "deployments" / "production"
    incomplete.mkdir(parents=True)
    (incomplete / "current.json").write_text(json.dumps({"bundle_id": "abc123", "sequence": 1}))
    torn_history = home / "deployments" / "drill"
    torn_history.mkdir(parents=True)
    (torn_history / "current.json").write_text(
        json.dumps({**_pointer_state("drill", "abc123"), "bundle_id": None, "bundle_path": None})
    )
    (torn_history / "history.jsonl").write_text("{not an event}\n")
    bad = {ref["ref"]: ref for ref in verify_store(home)["bad_refs"]}
    # Each problem names the file that is damaged.
    assert sorted(bad) == [str(torn_history / "history.jsonl"), str(incomplete / "current.json")]
    assert "missing pointer, bundle_path, updated_at, stack" in bad[str(incomplete / "current.json")]["problem"]
    assert "history.jsonl, line 1: not a JSON event" in bad[str(torn_history / "history.jsonl")]["problem"]


def test_a_damaged_copy_set_aside_is_listed_not_damage(store: ArtifactStore, home: Path) -> None:
    build(store, "one")
    aside = home / "artifacts" / KIND / ".damaged-xyz-20260101T000000"
    aside.mkdir()
    result = verify_store(home, gc=True)
    assert result["ok"] is True and result["set_aside"] == [str(aside)] and aside.is_dir()


# ---- staging: stale (its writer died) and live --------------------------------------------------
def test_a_dead_writers_staging_is_stale_and_gc_removes_it(store: ArtifactStore, home: Path) -> None:
    died = run_writer(home, "dies", AIENG_CRASH_AT=f"artifact.staged:{KIND}")
    assert died.returncode == -signal.SIGKILL, died.stderr
    [staging] = staging_dirs(home)
    assert sorted(p.name for p in staging.iterdir()) == ["a.txt", "b.txt", MANIFEST]
    result = verify_store(home)
    assert result["ok"] is True and result["artifacts_checked"] == 0  # nothing half-written is visible
    assert result["staging"] == [{"path": str(staging), "type": "directory", "owner_alive": False}]
    assert result["stale_staging"] == 1 and result["removed"] == []

    collected = verify_store(home, gc=True)
    assert collected["removed"] == [str(staging)] and collected["stale_staging"] == 0
    assert not staging.exists()
    assert verify_store(home)["staging"] == []
    assert list((home / "artifacts" / KIND).iterdir()) == []  # its lock file went with it


def test_a_temporary_ref_file_of_a_dead_writer_is_collected(home: Path) -> None:
    died = run_writer(home, "dies", AIENG_CRASH_AT="atomic_file.synced")
    assert died.returncode == -signal.SIGKILL, died.stderr
    [temp] = sorted((home / "refs" / KIND).iterdir())
    assert temp.name.startswith("._unpartitioned.json.tmp-")
    result = verify_store(home)
    # The artifact was published; only its ref never was: intact, nothing points at it yet.
    assert result["ok"] is True and result["artifacts_checked"] == 1 and result["bad_refs"] == []
    assert result["staging"] == [{"path": str(temp), "type": "file", "owner_alive": False}]
    assert verify_store(home, gc=True)["removed"] == [str(temp)]
    assert not temp.exists()


def test_gc_keeps_the_staging_of_a_live_writer(home: Path, held_writer: HeldWriter) -> None:
    [staging] = staging_dirs(home)
    result = verify_store(home, gc=True)
    assert result["staging"] == [{"path": str(staging), "type": "directory", "owner_alive": True}]
    assert result["removed"] == [] and result["stale_staging"] == 0 and staging.is_dir()

    held_writer.release.touch()
    out, err = held_writer.process.communicate(timeout=DEADLINE_S)
    assert held_writer.process.returncode == 0, err
    assert staging_dirs(home) == []  # renamed into place by its writer
    final = verify_store(home)
    assert final["ok"] is True and final["artifacts_checked"] == 1 and final["staging"] == []
    assert (home / "artifacts" / KIND / out.strip() / "a.txt").is_file()


def test_gc_keeps_an_entry_whose_lock_another_process_holds(home: Path, tmp_path: Path) -> None:
    """Ownership is the flock on the staging directory's lock file, whoever holds it: a process
    holding it keeps the entry alive."""
    staging = home / "artifacts" / KIND / ".abc.tmp-held"
    staging.mkdir(parents=True)
    lock = staging.with_name(staging.name + ".lock")
    lock.touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()",
            str(lock),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        assert owner_alive(staging) is True
        assert remove_if_abandoned(staging) is False and staging.is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert owner_alive(staging) is False
    assert remove_if_abandoned(staging) is True and not staging.exists() and not lock.exists()


def test_a_writer_holds_its_temporary_file_until_the_replace(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """atomic_write_bytes owns its temp file while writing: probed from inside the write."""
    target = home / "refs" / "x.json"
    seen: list[bool] = []
    real_replace = os.replace

    def probing_replace(source: str | os.PathLike, destination: str | os.PathLike) -> None:
        fd = os.open(source, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a second open file description: must be refused
            seen.append(False)
        except BlockingIOError:
            seen.append(True)
        finally:
            os.close(fd)
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", probing_replace)
    atomic_write_bytes(target, b"{}")
    monkeypatch.undo()
    assert seen == [True] and target.read_bytes() == b"{}"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.json"]


def test_a_builders_own_lost_race_is_not_taken_for_the_artifacts(store: ArtifactStore, home: Path) -> None:
    """Only the artifact's own rename losing to another writer means "reuse theirs"; a builder whose
    own atomic write (a training checkpoint, say) finds its target taken fails, as it is."""

    def produce(staging: Path) -> Produced:
        (home / "work" / "step-1").mkdir(parents=True)
        (home / "work" / "step-1" / "x").write_text("the other writer's\n")
        with atomic_directory(home / "work" / "step-1") as checkpoint:
            (checkpoint / "x").write_text("ours\n")
        return Produced(content_sha256="0" * 64)

    spec = ArtifactSpec(kind=KIND, code_version="thing-v1", config_sha256="c" * 64)
    with pytest.raises(TargetExists, match="step-1 appeared while it was being written"):
        store.build(spec, produce)
    assert list((home / "artifacts" / KIND).iterdir()) == []


# ---- the command line -----------------------------------------------------------------------------
def test_cli_json_exit_codes(store: ArtifactStore, home: Path, capsys: pytest.CaptureFixture) -> None:
    artifact_id = build(store, "one")
    assert main(["--home", str(home), "store", "verify", "--json"]) == 0
    clean = json.loads(capsys.readouterr().out)
    assert clean["ok"] is True and clean["artifacts_checked"] == 1

    (home / "artifacts" / KIND / artifact_id / "data.txt").write_text("changed\n")
    assert main(["--home", str(home), "store", "verify", "--json"]) == 1
    captured = capsys.readouterr()
    damaged = json.loads(captured.out)  # one JSON document, nothing else on stdout
    assert damaged["ok"] is False and [d["id"] for d in damaged["damaged"]] == [artifact_id]
    assert captured.err.strip() == f"aieng: error: 1 damaged artifacts, 1 bad refs in {home}"


def test_cli_human_output_and_gc(home: Path, capsys: pytest.CaptureFixture) -> None:
    assert run_writer(home, "dies", AIENG_CRASH_AT=f"artifact.staged:{KIND}").returncode == -signal.SIGKILL
    [staging] = staging_dirs(home)
    assert main(["--home", str(home), "store", "verify"]) == 0  # stale staging alone is a warning
    out = capsys.readouterr().out
    assert out.startswith(f"store {home}: OK: 0 artifacts re-hashed, 0 damaged, 0 bad refs\n")
    assert f"staging directory {staging}: stale: no live writer" in out
    assert "WARNING: 1 stale staging entries left by writers that died" in out

    assert main(["--home", str(home), "store", "verify", "--gc"]) == 0
    assert f"staging directory {staging}: removed (no live writer)" in capsys.readouterr().out
    assert main(["--home", str(home), "store", "verify"]) == 0
    assert capsys.readouterr().out == f"store {home}: OK: 0 artifacts re-hashed, 0 damaged, 0 bad refs\n"


def test_cli_missing_home_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--home", str(tmp_path / "nowhere"), "store", "verify"]) == 1
    err = capsys.readouterr().err
    assert err == f"aieng: error: AIENG_HOME {tmp_path / 'nowhere'} does not exist (set AIENG_HOME or --home)\n"


# ---- the fault points themselves ------------------------------------------------------------------
def test_fault_points_parse_and_arm() -> None:
    assert parse_point("a.b") == ("a.b", 1) and parse_point("a.b@3") == ("a.b", 3)
    for bad in ("", "@2", "a@0", "a@x", "a@-1"):
        with pytest.raises(ValueError, match="bad fault point"):
            parse_point(bad)
    assert armed_points({"AIENG_CRASH_AT": "x@2", "AIENG_PAUSE_AT": "y"}) == {"x": ("crash", 2), "y": ("pause", 1)}
    assert armed_points({}) == {}
    crash_point("not.armed.in.this.process")  # a no-op


def test_a_crash_point_kills_at_its_nth_hit_only(home: Path) -> None:
    script = (
        "from aieng_core.faults import crash_point\n"
        "for i in range(1, 4):\n    print(i, flush=True)\n    crash_point('loop')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=writer_env(AIENG_CRASH_AT="loop@2"),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL and result.stdout == "1\n2\n"


# ---- every bundle the deployment history can roll back to ----------------------------------------
def build_bundle_like(store: ArtifactStore, name: str) -> str:
    """A serving_bundle artifact (two files; cheap: store verify only re-hashes)."""

    def produce(staging: Path) -> Produced:
        (staging / "model.safetensors").write_bytes(f"weights of {name}\n".encode() * 64)
        (staging / "serving.json").write_text(json.dumps({"name": name}))
        return Produced(content_sha256=sha256_bytes(name.encode()))

    spec = ArtifactSpec(kind="serving_bundle", code_version="bundle-v1", config_sha256="c" * 64, recipe={"n": name})
    return store.build(spec, produce).id


def deployed_three(store: ArtifactStore, home: Path) -> tuple[str, str, str]:
    """x, then y, then z promoted on production: z current, the stack [x, y]."""
    from aieng_core.deploy.deployments import Deployments

    x, y, z = (build_bundle_like(store, name) for name in ("x", "y", "z"))
    for bundle_id in (x, y, z):
        Deployments(home).promote(bundle_id, actor="tester", verify=False)
    return x, y, z


def test_every_bundle_a_pointer_can_roll_back_to_is_checked(
    store: ArtifactStore, home: Path, capsys: pytest.CaptureFixture
) -> None:
    x, y, z = deployed_three(store, home)
    result = verify_store(home)
    assert result["ok"] is True and result["artifacts_checked"] == 3
    assert result["deployments"] == [
        {"pointer": "production", "bundle_id": z, "role": "current", "position": 0, "ok": True, "problem": None},
        {"pointer": "production", "bundle_id": y, "role": "rollback", "position": 1, "ok": True, "problem": None},
        {"pointer": "production", "bundle_id": x, "role": "rollback", "position": 2, "ok": True, "problem": None},
    ]
    assert main(["--home", str(home), "store", "verify"]) == 0
    assert capsys.readouterr().out == (
        f"store {home}: OK: 3 artifacts re-hashed, 0 damaged, 0 bad refs\n"
        "  deployments: 3 bundles served or reachable by rollback on 1 pointers, 0 damaged or missing\n"
    )


def test_a_damaged_or_missing_rollback_target_fails_store_verify(
    store: ArtifactStore, home: Path, capsys: pytest.CaptureFixture
) -> None:
    x, y, _ = deployed_three(store, home)
    damaged = home / "artifacts" / "serving_bundle" / y / "model.safetensors"
    data = bytearray(damaged.read_bytes())
    data[10] ^= 0x01
    damaged.write_bytes(bytes(data))
    shutil.rmtree(home / "artifacts" / "serving_bundle" / x)  # gone from the store altogether
    missing = home / "artifacts" / "serving_bundle" / x / MANIFEST

    assert main(["--home", str(home), "store", "verify", "--json"]) == 1
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["ok"] is False and [d["id"] for d in result["damaged"]] == [y]
    assert result["bad_refs"] == []  # the current pointer names z, which is intact
    assert [(e["bundle_id"], e["role"], e["position"], e["ok"], e["problem"]) for e in result["deployments"]][1:] == [
        (y, "rollback", 1, False, f"{damaged}: sha256 does not match the manifest"),
        (x, "rollback", 2, False, f"{missing}: missing (serving_bundle {x} is not in the store)"),
    ]
    assert captured.err == (
        f"aieng: error: 1 damaged artifacts, 0 bad refs, 2 deployed or rollback bundles damaged or missing in {home}\n"
    )

    assert main(["--home", str(home), "store", "verify"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"store {home}: DAMAGED: 2 artifacts re-hashed, 1 damaged, 0 bad refs"
    assert f"  DEPLOYMENT production rollback target 1 {y}: {damaged}: sha256 does not match the manifest" in out
    assert f"  DEPLOYMENT production rollback target 2 {x}: {missing}: missing" in out


def test_a_missing_rollback_target_alone_fails_store_verify(store: ArtifactStore, home: Path) -> None:
    """Only the stack names it: no artifact is damaged, no ref is bad, and yet a rollback would fail."""
    x, _, _ = deployed_three(store, home)
    shutil.rmtree(home / "artifacts" / "serving_bundle" / x)
    result = verify_store(home)
    assert (result["ok"], result["damaged"], result["bad_refs"]) == (False, [], [])
    assert [e["bundle_id"] for e in result["deployments"] if not e["ok"]] == [x]
