"""`aieng store gc`: what it keeps (roots and all they reach), what it deletes (exactly the rest,
bytes counted), and that it never takes what a live writer holds, or leaves half an artifact
when killed. The store is crafted (tests/core/gc_helpers.py); real bundles, real rollbacks and
a real server's hold are in tests/core/deploy/test_gc_deployments.py.

Live writers are real processes held at a named point (AIENG_PAUSE_AT); a killed gc is a real
process SIGKILLed at a named point (AIENG_CRASH_AT).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aieng_core.deploy.deployments import DeploymentError, Deployments
from aieng_core.store import ArtifactNotFound
from aieng_core.store.artifacts import MANIFEST
from aieng_core.store.gc import GC_PREFIX, GcRefused, collect_garbage
from aieng_core.store.verify import verify_store
from tests.core.gc_helpers import GARBAGE, KEPT, GcHome, dir_bytes, make_gc_home
from tests.core.test_store_verify import DEADLINE_S, writer_env

NOW = dt.timedelta(0)  # keep_newer_than: nothing is kept for being recent


@pytest.fixture
def gc_home(home: Path) -> GcHome:
    return make_gc_home(home)


def keys(entries: list[dict]) -> list[tuple[str, str]]:
    return sorted((entry["kind"], entry["id"]) for entry in entries)


def artifact_dirs(home: Path) -> list[str]:
    """kind/name of every entry under artifacts/, artifacts and anything else."""
    return sorted(f"{p.parent.name}/{p.name}" for p in (home / "artifacts").glob("*/*"))


# ---- what goes and what stays -----------------------------------------------------------------
def test_gc_deletes_exactly_what_no_root_reaches(gc_home: GcHome) -> None:
    home, a = gc_home.home, gc_home.a
    sizes = {gc_home.key(name): dir_bytes(a[name].path) for name in GARBAGE}
    before = artifact_dirs(home)

    planned = collect_garbage(home, dry_run=True, keep_newer_than=NOW)
    assert artifact_dirs(home) == before  # a dry run deletes nothing
    assert keys(planned["deleted"]) == gc_home.keys(*GARBAGE)
    assert planned["bytes_freed"] == sum(sizes.values()) > 0

    result = collect_garbage(home, keep_newer_than=NOW)
    assert keys(result["deleted"]) == gc_home.keys(*GARBAGE)
    assert {(e["kind"], e["id"]): e["bytes"] for e in result["deleted"]} == sizes
    assert result["bytes_freed"] == planned["bytes_freed"] == sum(sizes.values())
    assert keys(result["kept"]) == gc_home.keys(*KEPT)
    assert (result["held"], result["unreadable"], result["missing_inputs"], result["leftovers_removed"]) == (
        [],
        [],
        [],
        [],
    )
    roots = result["roots"]
    assert roots["pointers"] == [{"pointer": "production", "bundle_id": a["z"].id, "in_store": True}]
    assert [(r["bundle_id"], r["position"]) for r in roots["rollback"]] == [(a["y"].id, 1), (a["x"].id, 2)]
    assert [(p["kind"], p["id"], p["reason"]) for p in roots["pins"]] == [
        ("clean_documents", a["clean_pin"].id, "the audit of 2025-12-30")
    ]
    assert roots["refs"] == [
        {"kind": "raw_documents", "partition": "2025-12-31", "id": a["raw_new"].id, "in_store": True}
    ]
    assert roots["recent"] == []
    for name in GARBAGE:
        assert not a[name].path.exists()
    assert sorted(artifact_dirs(home)) == sorted(f"{kind}/{i}" for kind, i in gc_home.keys(*KEPT))

    final = verify_store(home)
    assert final["ok"] is True and final["artifacts_checked"] == len(KEPT) and final["gc_leftovers"] == []
    assert collect_garbage(home, keep_newer_than=NOW)["deleted"] == []  # nothing left to collect


def test_recent_artifacts_are_roots_until_they_age(gc_home: GcHome) -> None:
    home, a = gc_home.home, gc_home.a
    kept = collect_garbage(home, dry_run=True, keep_newer_than=dt.timedelta(days=7))
    assert kept["deleted"] == [] and len(kept["roots"]["recent"]) == len(GARBAGE) + len(KEPT)
    # Two weeks on, the same store keeps only what a root reaches.
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=14)
    aged = collect_garbage(home, dry_run=True, keep_newer_than=dt.timedelta(days=7), now=later)
    assert keys(aged["deleted"]) == gc_home.keys(*GARBAGE) and aged["roots"]["recent"] == []

    # An old clean_documents artifact of the old landing: it goes; its raw input, recent, stays.
    manifest_path = a["clean_old"].path / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["created_at"] = (dt.datetime.now(dt.UTC) - dt.timedelta(days=30)).isoformat(timespec="seconds")
    manifest_path.write_text(json.dumps(manifest))
    result = collect_garbage(home, keep_newer_than=dt.timedelta(days=7))
    assert keys(result["deleted"]) == gc_home.keys("clean_old")
    assert gc_home.key("raw_old") in keys(result["roots"]["recent"]) and a["raw_old"].path.is_dir()
    assert verify_store(home)["ok"] is True


def test_rollback_depth_keeps_only_the_top_of_the_stack(gc_home: GcHome) -> None:
    home, a = gc_home.home, gc_home.a
    result = collect_garbage(home, keep_newer_than=NOW, rollback_depth=1)
    assert keys(result["deleted"]) == gc_home.keys("x", *GARBAGE)
    assert [r["bundle_id"] for r in result["roots"]["rollback"]] == [a["y"].id]
    deployments = Deployments(home)
    assert deployments.rollback(actor="tester", verify=False)["to"] == a["y"].id
    with pytest.raises(DeploymentError) as gone:
        deployments.rollback(actor="tester", verify=False)
    # Its recipe is recorded: the hint names the command that rebuilds that very bundle, and where to restore it.
    assert f"it is gone from the store: `aieng store rebuild {a['x'].id}` rebuilds that exact bundle" in str(gone.value)
    assert f"restore {home / 'artifacts' / 'serving_bundle' / a['x'].id}/ from a backup" in str(gone.value)
    assert deployments.current()["bundle_id"] == a["y"].id  # the refused rollback changed nothing


def test_a_missing_input_is_reported_and_an_unreadable_manifest_kept(gc_home: GcHome) -> None:
    home, a = gc_home.home, gc_home.a
    shutil.rmtree(a["model"].path)  # the deployed bundles' model, gone by hand
    stray = home / "artifacts" / "clean_documents" / "2025-12-29-0123456789abcdef"
    stray.mkdir()
    (stray / MANIFEST).write_text("{not json")
    result = collect_garbage(home, keep_newer_than=NOW)
    assert keys(result["deleted"]) == gc_home.keys(*GARBAGE)
    assert {(m["kind"], m["id"]) for m in result["missing_inputs"]} == {gc_home.key("model")}
    assert sorted(m["needed_by"] for m in result["missing_inputs"]) == sorted(
        f"serving_bundle {a[name].id}" for name in ("x", "y", "z")
    )
    [unreadable] = result["unreadable"]
    assert (unreadable["id"], stray.is_dir()) == (stray.name, True)


def test_gc_refuses_when_it_cannot_tell_what_a_root_keeps(gc_home: GcHome) -> None:
    home, a = gc_home.home, gc_home.a
    before = artifact_dirs(home)
    ref = home / "refs" / "raw_documents" / "2025-12-31.json"
    good = ref.read_bytes()
    ref.write_text("{torn")
    with pytest.raises(GcRefused, match="cannot tell what .*2025-12-31.json keeps: unreadable"):
        collect_garbage(home, keep_newer_than=NOW)
    ref.write_bytes(good)
    (a["y"].path / MANIFEST).write_text("[]")  # a rollback target whose inputs nobody can read
    with pytest.raises(GcRefused, match=f"cannot tell what serving_bundle {a['y'].id} needs"):
        collect_garbage(home, keep_newer_than=NOW)
    assert artifact_dirs(home) == before


# ---- what a live writer or server holds --------------------------------------------------------
def test_a_held_artifact_is_skipped_until_let_go(gc_home: GcHome) -> None:
    home, store, a = gc_home.home, gc_home.store, gc_home.a
    with store.hold(a["old_bundle"]):  # another open file description in this very process
        result = collect_garbage(home, keep_newer_than=NOW)
        assert keys(result["held"]) == gc_home.keys("old_bundle")
        assert keys(result["deleted"]) == gc_home.keys("old_model", "raw_old", "clean_old")
        assert store.verify(a["old_bundle"]) == []
    assert keys(collect_garbage(home, keep_newer_than=NOW)["deleted"]) == gc_home.keys("old_bundle")
    with pytest.raises(ArtifactNotFound, match="is not in the store"):
        with store.hold(a["old_bundle"]):
            pass


# A writer in its own process: builds a `thing` from the input named on the command line.
WRITER = """
import sys
from pathlib import Path
from aieng_core.store import ArtifactSpec, ArtifactStore, Produced

def produce(staging: Path) -> Produced:
    (staging / "a.txt").write_text("built\\n")
    return Produced(content_sha256="0" * 64)

spec = ArtifactSpec(kind="thing", code_version="thing-v1", config_sha256="c" * 64, inputs=((sys.argv[2], sys.argv[3]),))
print(ArtifactStore(sys.argv[1]).build(spec, produce).id, flush=True)
"""


def held_writer(home: Path, tmp_path: Path, input_key: tuple[str, str], point: str) -> tuple[subprocess.Popen, Path]:
    release = tmp_path / "release"
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(home), *input_key],
        env=writer_env(AIENG_PAUSE_AT=point, AIENG_PAUSE_FILE=str(release)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + DEADLINE_S
    while not list(tmp_path.glob("release.*.waiting")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"the writer never reached {point}"
        time.sleep(0.02)
    return process, release


def test_a_building_writer_holds_its_inputs(gc_home: GcHome, tmp_path: Path) -> None:
    home = gc_home.home
    process, release = held_writer(home, tmp_path, gc_home.key("raw_old"), "artifact.staged:thing")
    try:
        result = collect_garbage(home, keep_newer_than=NOW)  # the writer holds no gc lock while it produces
        assert keys(result["held"]) == gc_home.keys("raw_old")
        assert keys(result["deleted"]) == gc_home.keys("old_bundle", "old_model", "clean_old")
    finally:
        release.touch()
        out, err = process.communicate(timeout=DEADLINE_S)
    assert process.returncode == 0, err
    # The thing is current now, and reaches raw_old: both stay.
    after = collect_garbage(home, keep_newer_than=NOW)
    assert after["deleted"] == [] and ("thing", out.strip()) in keys(after["kept"])
    assert verify_store(home)["ok"] is True


def test_gc_waits_while_a_writer_publishes(gc_home: GcHome, tmp_path: Path) -> None:
    """Between the rename that publishes an artifact and its ref, no root reaches it: the writer
    holds the gc lock shared there, and gc waits."""
    home = gc_home.home
    process, release = held_writer(home, tmp_path, gc_home.key("raw_new"), "artifact.published:thing")
    waited = threading.Event()
    results: list[dict] = []
    gc = threading.Thread(target=lambda: results.append(collect_garbage(home, keep_newer_than=NOW, on_wait=waited.set)))
    gc.start()
    try:
        assert waited.wait(DEADLINE_S), "gc did not wait for the publishing writer"
        time.sleep(0.2)
        assert results == [] and gc.is_alive()
    finally:
        release.touch()
        out, err = process.communicate(timeout=DEADLINE_S)
        gc.join(DEADLINE_S)
    assert process.returncode == 0, err
    [result] = results
    assert ("thing", out.strip()) in keys(result["kept"])
    assert keys(result["deleted"]) == gc_home.keys(*GARBAGE)
    assert [r["kind"] for r in result["roots"]["refs"]] == ["raw_documents", "thing"]


# ---- a kill mid-gc -------------------------------------------------------------------------------
GC_SCRIPT = (
    "import datetime, sys\n"
    "from aieng_core.store.gc import collect_garbage\n"
    "collect_garbage(sys.argv[1], keep_newer_than=datetime.timedelta(0))\n"
)


@pytest.mark.parametrize("point", ["gc.file_removed@2", "gc.renamed@2", "gc.deleted@3"])
def test_a_kill_during_gc_leaves_whole_artifacts(gc_home: GcHome, point: str) -> None:
    home, a = gc_home.home, gc_home.a
    killed = subprocess.run(
        [sys.executable, "-c", GC_SCRIPT, str(home)],
        env=writer_env(AIENG_CRASH_AT=point),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    result = verify_store(home)  # every artifact left is whole: nothing is damaged
    assert result["ok"] is True and result["damaged"] == [] and result["unexpected"] == []
    remaining = [name for name in GARBAGE if a[name].path.is_dir()]
    assert result["artifacts_checked"] == len(KEPT) + len(remaining)
    gone = len(GARBAGE) - len(remaining)
    # Killed inside its first or second deletion, or after its third.
    assert gone == {"gc.file_removed@2": 1, "gc.renamed@2": 2, "gc.deleted@3": 3}[point]
    leftovers = sorted(p for p in (home / "artifacts").glob(f"*/{GC_PREFIX}*"))
    assert len(leftovers) == (0 if point.startswith("gc.deleted") else 1)
    assert result["gc_leftovers"] == [str(path) for path in leftovers]

    again = collect_garbage(home, keep_newer_than=NOW)
    assert again["leftovers_removed"] == [str(path) for path in leftovers]
    assert keys(again["deleted"]) == gc_home.keys(*remaining)
    final = verify_store(home)
    assert final["ok"] is True and final["gc_leftovers"] == [] and final["artifacts_checked"] == len(KEPT)
    assert list((home / "artifacts").glob(f"*/{GC_PREFIX}*")) == []
