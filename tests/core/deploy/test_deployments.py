"""Deployments: promote, rollback, status; refusals change nothing; two processes never
interleave a change; a crash between the two writes, a torn history line and a damaged
current.json are each reported, never papered over."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aieng_core.bundle.serving_bundle import BUNDLE_FILES, GOLDEN_FILE, KIND
from aieng_core.deploy.deployments import DeploymentError, Deployments, DeploymentStateError, default_actor
from aieng_core.hashing import canonical_json, sha256_file
from aieng_core.store import pointers as pointers_module
from aieng_core.store.artifacts import MANIFEST
from aieng_core.store.pointers import unapplied_sequences
from tests.bundle_fixtures import BundledHome
from tests.conftest import REPO_ROOT
from tests.core.deploy import BundlePair, build_bundle_pair, home_with_bundles, replay


@pytest.fixture(scope="module")
def pair(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> BundlePair:
    return build_bundle_pair(tmp_path_factory.mktemp("deploy-pair"), serving_bundle_artifact)


@pytest.fixture
def deploy_home(pair: BundlePair, tmp_path: Path) -> Path:
    return home_with_bundles(tmp_path / "deploy-home", pair)


def without_time(event: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in event.items() if key != "time"}


def event(sequence: int, action: str, source: str | None, target: str | None, **fields: Any) -> dict[str, Any]:
    """An expected history event, without its time: a rollback withdraws its `from`."""
    if action == "promote":
        withdrawal = {
            "allow_withdrawn": fields.pop("allow_withdrawn", False),
            "overrode_withdrawal": fields.pop("overrode_withdrawal", None),
        }
    else:
        withdrawal = {"withdrawn": source, "skipped_withdrawn": fields.pop("skipped_withdrawn", [])}
    expected = {
        "sequence": sequence,
        "pointer": fields.pop("pointer", "production"),
        "action": action,
        "from": source,
        "to": target,
        "actor": fields.pop("actor", "tester"),
        "reason": fields.pop("reason", ""),
        "figures": fields.pop("figures", {}),
        "dagster_run_id": fields.pop("dagster_run_id", None),
        **withdrawal,
    }
    assert not fields, fields
    return expected


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file of a pointer's directory, by name (the lock file aside)."""
    if not directory.is_dir():
        return {}
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.name != ".lock"}


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_nothing_deployed_yet(deploy_home: Path) -> None:
    deployments = Deployments(deploy_home)
    assert deployments.current() == {
        "pointer": "production",
        "bundle_id": None,
        "bundle_path": None,
        "sequence": 0,
        "updated_at": None,
        "stack": [],
    }
    assert deployments.current_bundle_path() is None
    assert deployments.history() == []
    assert deployments.status() == {
        "pointer": "production",
        "sequence": 0,
        "current": None,
        "previous": None,
        "stack": [],
        "withdrawn": [],
        "history": [],
        "unapplied": [],
        "torn_tail": None,
        "canary": None,
        "canary_history": [],
    }
    assert deployments.withdrawn() == {} and deployments.rollback_target() is None
    assert not (deploy_home / "deployments").exists()  # reading creates nothing


def test_first_promote_verifies_records_and_switches(deploy_home: Path, pair: BundlePair) -> None:
    deployments = Deployments(deploy_home)
    before = dt.datetime.now(dt.UTC)
    recorded = deployments.promote(
        pair.a.id, actor="tester", reason="first", figures={"perplexity": 12.5}, dagster_run_id="run-1"
    )
    assert without_time(recorded) == event(
        1, "promote", None, pair.a.id, reason="first", figures={"perplexity": 12.5}, dagster_run_id="run-1"
    )
    when = dt.datetime.fromisoformat(recorded["time"])
    assert when.utcoffset() == dt.timedelta(0)
    assert before - dt.timedelta(seconds=1) <= when <= dt.datetime.now(dt.UTC)

    bundle_path = str(deploy_home / "artifacts" / KIND / pair.a.id)
    state = {
        "pointer": "production",
        "bundle_id": pair.a.id,
        "bundle_path": bundle_path,
        "sequence": 1,
        "updated_at": recorded["time"],
        "stack": [],
    }
    directory = deploy_home / "deployments" / "production"
    assert (directory / "current.json").read_bytes() == canonical_json(state)
    assert (directory / "history.jsonl").read_bytes() == canonical_json(recorded) + b"\n"
    assert sorted(path.name for path in directory.iterdir()) == [".lock", "current.json", "history.jsonl"]
    assert deployments.current() == state
    assert deployments.current_bundle_path() == Path(bundle_path)
    assert deployments.history() == [recorded]
    assert deployments.status() == {
        "pointer": "production",
        "sequence": 1,
        "current": {
            "bundle_id": pair.a.id,
            "bundle_path": bundle_path,
            "in_store": True,
            "since": recorded["time"],
            "sequence": 1,
        },
        "previous": None,
        "stack": [],
        "withdrawn": [],
        "history": [recorded],
        "unapplied": [],
        "torn_tail": None,
        "canary": None,
        "canary_history": [],
    }


def test_promote_b_then_rollback_returns_to_a(deploy_home: Path, pair: BundlePair) -> None:
    deployments = Deployments(deploy_home)
    first = deployments.promote(pair.a.id, actor="tester", verify=False)
    second = deployments.promote(pair.b.id, actor="tester", reason="better", verify=True)
    assert deployments.current()["stack"] == [pair.a.id]
    status = deployments.status()
    assert status["current"]["bundle_id"] == pair.b.id
    assert status["previous"] == {
        "bundle_id": pair.a.id,
        "bundle_path": str(deploy_home / "artifacts" / KIND / pair.a.id),
        "in_store": True,
        "integrity": "ok",
        "rollback_check": None,
    }
    assert deployments.rollback_target() == pair.a.id

    back = deployments.rollback(actor="tester", reason="regression", figures={"p95_ms": 80})
    assert [without_time(e) for e in deployments.history()] == [
        event(1, "promote", None, pair.a.id),
        event(2, "promote", pair.a.id, pair.b.id, reason="better"),
        event(3, "rollback", pair.b.id, pair.a.id, reason="regression", figures={"p95_ms": 80}),
    ]
    assert deployments.history() == [first, second, back]
    current = deployments.current()
    assert (current["bundle_id"], current["sequence"], current["stack"]) == (pair.a.id, 3, [])
    assert current["updated_at"] == back["time"]
    assert deployments.current_bundle_path() == deploy_home / "artifacts" / KIND / pair.a.id
    assert deployments.status()["previous"] is None


def test_the_stack_remembers_every_earlier_bundle_and_a_rollback_passes_over_withdrawn_ones(
    deploy_home: Path, pair: BundlePair
) -> None:
    deployments = Deployments(deploy_home)
    for bundle in (pair.a, pair.b, pair.a, pair.b):
        deployments.promote(bundle.id, actor="tester", verify=False)
    assert deployments.current()["stack"] == [pair.a.id, pair.b.id, pair.a.id]
    first = deployments.rollback(actor="tester", verify=False)
    assert without_time(first) == event(5, "rollback", pair.b.id, pair.a.id)
    assert deployments.current()["stack"] == [pair.a.id, pair.b.id]
    # B is withdrawn and A is the one a rollback now leaves: nothing on the stack may be landed on.
    assert deployments.rollback_target() is None and deployments.status()["previous"] is None
    directory = deploy_home / "deployments" / "production"
    before = snapshot(directory)
    with pytest.raises(DeploymentError) as refused:
        deployments.rollback(actor="tester")
    assert str(refused.value) == (
        f"nothing to roll back to: the bundles on production's stack ({pair.b.id}, {pair.a.id}) are withdrawn "
        "or current (allow_empty / --allow-empty rolls back to no bundle at all)"
    )
    assert snapshot(directory) == before
    emptied = deployments.rollback(actor="tester", allow_empty=True)
    assert without_time(emptied) == event(6, "rollback", pair.a.id, None, skipped_withdrawn=[pair.b.id, pair.a.id])
    current = deployments.current()
    assert (current["bundle_id"], current["sequence"], current["stack"]) == (None, 6, [])
    assert deployments.withdrawn() == {pair.b.id: first, pair.a.id: emptied}
    assert replay(deployments.history()) == (None, [])


def test_rollback_with_an_empty_stack(deploy_home: Path, pair: BundlePair) -> None:
    deployments = Deployments(deploy_home)
    directory = deploy_home / "deployments" / "production"
    with pytest.raises(DeploymentError) as nothing:
        deployments.rollback(allow_empty=True)
    assert str(nothing.value) == "nothing is deployed on production: there is nothing to roll back"
    assert snapshot(directory) == {}

    deployments.promote(pair.a.id, actor="tester", verify=False)
    before = snapshot(directory)
    with pytest.raises(DeploymentError) as only:
        deployments.rollback()
    assert str(only.value) == (
        f"nothing to roll back to: {pair.a.id} is the only bundle deployed on production "
        "(allow_empty / --allow-empty rolls back to no bundle at all)"
    )
    assert snapshot(directory) == before

    emptied = deployments.rollback(actor="tester", reason="drill", allow_empty=True)
    assert without_time(emptied) == event(2, "rollback", pair.a.id, None, reason="drill")
    assert deployments.current() == {
        "pointer": "production",
        "bundle_id": None,
        "bundle_path": None,
        "sequence": 2,
        "updated_at": emptied["time"],
        "stack": [],
    }
    assert deployments.current_bundle_path() is None
    status = deployments.status()
    assert (status["current"], status["previous"], status["sequence"]) == (None, None, 2)

    with pytest.raises(DeploymentError, match="^nothing is deployed on production"):
        deployments.rollback(allow_empty=True)
    # The drill's restore: promoting onto "no bundle" pushes nothing onto the stack (the
    # rollback withdrew A: promoting it again is said explicitly, and recorded).
    again = deployments.promote(pair.a.id, actor="tester", verify=False, allow_withdrawn=True)
    assert without_time(again) == event(3, "promote", None, pair.a.id, allow_withdrawn=True, overrode_withdrawal=2)
    assert deployments.current()["stack"] == []


def test_an_unknown_or_invalid_bundle_id_is_refused(deploy_home: Path, pair: BundlePair) -> None:
    deployments = Deployments(deploy_home)
    with pytest.raises(DeploymentError) as unknown:
        deployments.promote("0123456789abcdef")
    missing = deploy_home / "artifacts" / KIND / "0123456789abcdef" / MANIFEST
    assert str(unknown.value) == (
        f"cannot promote '0123456789abcdef' on production: no {KIND} '0123456789abcdef' in "
        f"{deploy_home / 'artifacts' / KIND} ({missing} is missing); `aieng bundle build` builds one, "
        "`aieng bundle current` names the newest"
    )
    with pytest.raises(DeploymentError, match=r"^cannot promote '\.\./x' on production: invalid bundle id '\.\./x'"):
        deployments.promote("../x")
    assert not (deploy_home / "deployments").exists()


def test_an_artifact_of_another_kind_is_named(pair: BundlePair, tmp_path: Path) -> None:
    model_id = pair.a.manifest["inputs"][0]["id"]
    deployments = Deployments(tmp_path / "elsewhere", store=pair.store)
    with pytest.raises(DeploymentError) as refused:
        deployments.promote(model_id)
    assert f"({model_id} is a model_checkpoint, not a {KIND})" in str(refused.value)
    assert not (tmp_path / "elsewhere").exists()


def test_a_bundle_copied_under_another_id_is_refused(deploy_home: Path, pair: BundlePair) -> None:
    shutil.copytree(deploy_home / "artifacts" / KIND / pair.a.id, deploy_home / "artifacts" / KIND / "copied")
    with pytest.raises(DeploymentError) as refused:
        Deployments(deploy_home).promote("copied", verify=False)
    assert str(refused.value) == (
        f"cannot promote 'copied' on production: {deploy_home / 'artifacts' / KIND / 'copied' / MANIFEST} "
        f"names id {pair.a.id!r}, not 'copied' (a bundle copied under another id)"
    )


@pytest.mark.parametrize("name", ["serving.json", "model.safetensors"])
def test_a_tampered_bundle_is_refused_and_nothing_changes(deploy_home: Path, pair: BundlePair, name: str) -> None:
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    directory = deploy_home / "deployments" / "production"
    before = snapshot(directory)
    damaged = deploy_home / "artifacts" / KIND / pair.b.id / name
    flip_one_byte(damaged)
    with pytest.raises(DeploymentError) as refused:
        deployments.promote(pair.b.id)
    assert str(refused.value) == (
        f"refusing to promote {KIND} {pair.b.id} on production: {damaged}: sha256 does not match the manifest; "
        f"nothing changed (`aieng bundle verify {damaged.parent}` lists every problem)"
    )
    assert snapshot(directory) == before
    assert deployments.status()["unapplied"] == []


def test_a_bundle_whose_goldens_do_not_replay_is_refused_naming_the_prompt(deploy_home: Path, pair: BundlePair) -> None:
    bundle = deploy_home / "artifacts" / KIND / pair.b.id
    doc = json.loads((bundle / GOLDEN_FILE).read_text(encoding="utf-8"))
    assert doc["outputs"][1]["prompt"] == "数据清洗"
    doc["outputs"][1]["token_ids"][0] += 1
    (bundle / GOLDEN_FILE).write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    # Re-hash the manifest as someone covering their tracks would: only the replay can tell.
    manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"][GOLDEN_FILE] = sha256_file(bundle / GOLDEN_FILE)
    from aieng_core.bundle.serving_bundle import bundle_content_sha256

    manifest["content_sha256"] = bundle_content_sha256({n: manifest["files"][n] for n in BUNDLE_FILES})
    (bundle / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")

    with pytest.raises(DeploymentError) as refused:
        Deployments(deploy_home).promote(pair.b.id)
    assert str(refused.value).startswith(
        f"refusing to promote {KIND} {pair.b.id} on production: {bundle / GOLDEN_FILE}: golden prompt '数据清洗' "
        "differs from token 0"
    )
    assert not (deploy_home / "deployments" / "production" / "current.json").exists()
    # Without verification the same bundle would go through: the replay was what refused it.
    assert Deployments(deploy_home).promote(pair.b.id, verify=False)["to"] == pair.b.id


def test_promoting_the_current_bundle_is_refused(deploy_home: Path, pair: BundlePair) -> None:
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    deployments.promote(pair.b.id, actor="tester", verify=False)
    directory = deploy_home / "deployments" / "production"
    before = snapshot(directory)
    with pytest.raises(DeploymentError) as refused:
        deployments.promote(pair.b.id)  # refused before the (slow) verification runs
    updated = deployments.current()["updated_at"]
    assert str(refused.value) == (
        f"{KIND} {pair.b.id} is already current on production (since {updated}, sequence 2); nothing changed"
    )
    assert snapshot(directory) == before


def test_the_drill_pointer_never_touches_production(deploy_home: Path, pair: BundlePair) -> None:
    production = Deployments(deploy_home)
    production.promote(pair.a.id, actor="tester", verify=False)
    production_dir = deploy_home / "deployments" / "production"
    before = snapshot(production_dir)

    drill = Deployments(deploy_home, pointer="drill")
    drill.promote(pair.b.id, actor="gate", verify=False)
    drill.rollback(actor="gate", allow_empty=True)
    drill.promote(pair.b.id, actor="gate", verify=False, allow_withdrawn=True)

    assert snapshot(production_dir) == before
    assert production.current()["bundle_id"] == pair.a.id
    assert [without_time(e) for e in production.history()] == [event(1, "promote", None, pair.a.id)]
    assert [without_time(e) for e in drill.history()] == [
        event(1, "promote", None, pair.b.id, pointer="drill", actor="gate"),
        event(2, "rollback", pair.b.id, None, pointer="drill", actor="gate"),
        event(
            3, "promote", None, pair.b.id, pointer="drill", actor="gate", allow_withdrawn=True, overrode_withdrawal=2
        ),
    ]
    assert production.withdrawn() == {}  # the drill's rollback withdrew B on the drill pointer only
    assert drill.current()["pointer"] == "drill"
    assert sorted(path.name for path in (deploy_home / "deployments").iterdir()) == ["drill", "production"]
    with pytest.raises(DeploymentError, match="invalid deployment pointer '../production'"):
        Deployments(deploy_home, pointer="../production")


def test_the_default_actor_is_user_at_host(
    deploy_home: Path, pair: BundlePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert default_actor() == f"{getpass.getuser()}@{socket.gethostname()}"
    assert Deployments(deploy_home).promote(pair.a.id, verify=False)["actor"] == default_actor()

    def no_user() -> str:
        raise OSError("No username set in the environment")

    monkeypatch.setattr(getpass, "getuser", no_user)
    assert default_actor() == f"uid{os.getuid()}@{socket.gethostname()}"


def test_figures_must_be_plain_json(deploy_home: Path, pair: BundlePair) -> None:
    with pytest.raises(DeploymentError, match="^figures must be plain JSON"):
        Deployments(deploy_home).promote(pair.a.id, figures={"loss": float("nan")}, verify=False)
    with pytest.raises(DeploymentError, match="^reason must be a string"):
        Deployments(deploy_home).promote(pair.a.id, reason=None, verify=False)  # type: ignore[arg-type]
    assert not (deploy_home / "deployments").exists()


def test_a_rollback_to_a_bundle_gone_from_the_store_is_refused(deploy_home: Path, pair: BundlePair) -> None:
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    deployments.promote(pair.b.id, actor="tester", verify=False)
    shutil.rmtree(deploy_home / "artifacts" / KIND / pair.a.id)
    directory = deploy_home / "deployments" / "production"
    before = snapshot(directory)
    assert deployments.status()["previous"] == {
        "bundle_id": pair.a.id,
        "bundle_path": str(deploy_home / "artifacts" / KIND / pair.a.id),
        "in_store": False,
        "integrity": "missing",
        "rollback_check": None,
    }
    missing = deploy_home / "artifacts" / KIND / pair.a.id / MANIFEST
    for verify in (True, False):
        with pytest.raises(DeploymentError) as refused:
            deployments.rollback(verify=verify)
        assert str(refused.value).startswith(
            f"cannot roll production back to '{pair.a.id}': no {KIND} {pair.a.id!r} in "
            f"{deploy_home / 'artifacts' / KIND} ({missing} is missing)"
        )
        assert snapshot(directory) == before


def test_the_current_bundle_path_follows_the_home(deploy_home: Path, pair: BundlePair, tmp_path: Path) -> None:
    Deployments(deploy_home).promote(pair.a.id, actor="tester", verify=False)
    moved = tmp_path / "moved-home"
    shutil.copytree(deploy_home, moved)
    assert Deployments(moved).current_bundle_path() == moved / "artifacts" / KIND / pair.a.id
    assert Deployments(moved).status()["current"]["bundle_path"] == str(moved / "artifacts" / KIND / pair.a.id)
    recorded = json.loads((moved / "deployments" / "production" / "current.json").read_bytes())["bundle_path"]
    assert recorded == str(deploy_home / "artifacts" / KIND / pair.a.id)  # where it was when promoted
    shutil.rmtree(moved / "artifacts" / KIND / pair.a.id)
    with pytest.raises(DeploymentError, match=f"^production's current {KIND} {pair.a.id} is not in the store"):
        Deployments(moved).current_bundle_path()
    assert Deployments(moved).status()["current"]["in_store"] is False


# ---- crashes and damage -----------------------------------------------------------------------


def test_a_crash_between_the_two_writes_leaves_an_unapplied_line(
    deploy_home: Path, pair: BundlePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    real_write = pointers_module.atomic_write_bytes

    def crash_before_current(path: Path, data: bytes) -> None:
        if path.name == "current.json":
            raise OSError("the machine lost power")
        real_write(path, data)

    monkeypatch.setattr(pointers_module, "atomic_write_bytes", crash_before_current)
    with pytest.raises(OSError, match="lost power"):
        deployments.promote(pair.b.id, actor="tester", verify=False)
    monkeypatch.setattr(pointers_module, "atomic_write_bytes", real_write)

    # current.json is the truth: A is still current; the dangling line is reported.
    status = deployments.status()
    assert (status["current"]["bundle_id"], status["sequence"], status["unapplied"]) == (pair.a.id, 1, [2])
    assert [without_time(e) for e in status["history"]] == [
        event(1, "promote", None, pair.a.id),
        event(2, "promote", pair.a.id, pair.b.id),
    ]
    # The next change takes the next number (2 is never reused) and starts from A.
    retried = deployments.promote(pair.b.id, actor="tester", verify=False)
    assert without_time(retried) == event(3, "promote", pair.a.id, pair.b.id)
    back = deployments.rollback(actor="tester")
    assert without_time(back) == event(4, "rollback", pair.b.id, pair.a.id)
    status = deployments.status()
    assert (status["current"]["bundle_id"], status["sequence"], status["unapplied"]) == (pair.a.id, 4, [2])
    assert [e["sequence"] for e in deployments.history()] == [1, 2, 3, 4]


def test_unapplied_sequences_follow_the_chain_of_changes() -> None:
    def line(sequence: int, source: str | None, target: str | None) -> dict[str, Any]:
        return {"sequence": sequence, "from": source, "to": target}

    chain = [line(1, None, "a"), line(2, "a", "b"), line(3, "b", "a")]
    assert unapplied_sequences(chain, {"sequence": 3}) == []
    assert unapplied_sequences(chain, {"sequence": 2}) == [3]
    # Two crashed changes in a row, then one that went through: both crashed lines start at "a".
    crashed = [line(1, None, "a"), line(2, "a", "b"), line(3, "a", "c"), line(4, "a", "d"), line(5, "d", "a")]
    assert unapplied_sequences(crashed, {"sequence": 5}) == [2, 3]
    assert unapplied_sequences([], {"sequence": 0}) == []


def test_a_torn_last_history_line_is_reported_then_moved_aside(
    deploy_home: Path, pair: BundlePair, caplog: pytest.LogCaptureFixture
) -> None:
    deployments = Deployments(deploy_home)
    first = deployments.promote(pair.a.id, actor="tester", verify=False)
    history_path = deploy_home / "deployments" / "production" / "history.jsonl"
    torn = b'{"action":"promote","figures":{},"fr'
    with history_path.open("ab") as handle:
        handle.write(torn)

    with caplog.at_level(logging.WARNING, logger="aieng.deploy"):
        assert deployments.history() == [first]
    assert caplog.messages == [
        f"{history_path}, line 2: incomplete last line ({len(torn)} bytes, no newline): an append a crash cut "
        "short, not a record; left out (the next change moves it aside)"
    ]
    status = deployments.status()
    assert (status["torn_tail"], status["unapplied"], status["history"]) == (
        {"line": 2, "bytes": len(torn)},
        [],
        [first],
    )

    second = deployments.promote(pair.b.id, actor="tester", verify=False)
    assert without_time(second) == event(2, "promote", pair.a.id, pair.b.id)
    assert history_path.read_bytes() == canonical_json(first) + b"\n" + canonical_json(second) + b"\n"
    asides = sorted(history_path.parent.glob("history.jsonl.torn-line2-*"))
    assert [path.read_bytes() for path in asides] == [torn]
    assert deployments.status()["torn_tail"] is None


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        (b"not json", "not a JSON event"),
        (b'{"sequence": 1}', "missing time, pointer, action, from, to, actor, reason, figures, dagster_run_id"),
        (None, "sequence 1 does not follow 1"),
    ],
    ids=["not-json", "not-an-event", "repeated-sequence"],
)
def test_a_damaged_complete_history_line_is_an_error_naming_the_line(
    deploy_home: Path, pair: BundlePair, bad_line: bytes | None, problem: str
) -> None:
    deployments = Deployments(deploy_home)
    first = deployments.promote(pair.a.id, actor="tester", verify=False)
    history_path = deploy_home / "deployments" / "production" / "history.jsonl"
    with history_path.open("ab") as handle:
        handle.write((canonical_json(first) if bad_line is None else bad_line) + b"\n")
    before = snapshot(history_path.parent)
    for attempt in (
        deployments.history,
        deployments.status,
        lambda: deployments.promote(pair.b.id, verify=False),
        deployments.rollback,
    ):
        with pytest.raises(DeploymentStateError) as damaged:
            attempt()
        assert str(damaged.value).startswith(f"{history_path}, line 2: {problem}")
        assert str(damaged.value).endswith("repair the line by hand (nothing is changed while the history is damaged)")
    assert snapshot(history_path.parent) == before


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"pointer": "production", "bundle_id"', "not valid JSON"),
        (b"[]", "not a JSON object"),
        (
            b'{"pointer":"production","bundle_id":"a","bundle_path":"/x","sequence":"1","updated_at":"t","stack":[]}',
            "sequence '1' is not a non-negative integer",
        ),
        (
            b'{"pointer":"production","bundle_id":"../a","bundle_path":"/x","sequence":1,"updated_at":"t","stack":[]}',
            "bundle_id '../a' is not null or a valid bundle id",
        ),
        (
            b'{"pointer":"drill","bundle_id":"a","bundle_path":"/x","sequence":1,"updated_at":"t","stack":[]}',
            "pointer is 'drill', not 'production'",
        ),
        (b'{"pointer":"production","bundle_id":null}', "missing bundle_path, sequence, updated_at, stack"),
    ],
    ids=["truncated", "not-an-object", "wrong-type", "bad-id", "other-pointer", "missing-keys"],
)
def test_a_damaged_current_json_is_an_error_naming_the_file(
    deploy_home: Path, pair: BundlePair, content: bytes, problem: str
) -> None:
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    current_path = deploy_home / "deployments" / "production" / "current.json"
    current_path.write_bytes(content)
    before = snapshot(current_path.parent)
    for attempt in (
        deployments.current,
        deployments.current_bundle_path,
        deployments.status,
        lambda: deployments.promote(pair.b.id, verify=False),
        lambda: deployments.rollback(allow_empty=True),
    ):
        with pytest.raises(DeploymentStateError) as damaged:
            attempt()
        assert str(damaged.value).startswith(f"{current_path}: {problem}")
        assert str(damaged.value).endswith("restore it by hand (it is never overwritten while damaged)")
    assert snapshot(current_path.parent) == before


# ---- two processes ---------------------------------------------------------------------------

CHANGER = r"""
import json, sys
from aieng_core.deploy import DeploymentError, Deployments, DeploymentStateError

home, mine, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
deployments = Deployments(home)
print("ready", flush=True)
sys.stdin.readline()  # both processes start changing at once
events, refused, seen = [], 0, []
changes = (  # each process takes back what the other's rollbacks withdrew: every change is a race
    lambda: deployments.promote(mine, actor=mine, verify=False, allow_withdrawn=True),
    lambda: deployments.rollback(actor=mine, allow_empty=True, verify=False),
)
for _ in range(rounds):
    for change in changes:
        try:
            events.append(change())
        except DeploymentStateError:  # damaged state is a failure, never an expected refusal
            raise
        except DeploymentError:  # already current / nothing deployed: the other process got there first
            refused += 1
        seen.append(deployments.current()["sequence"])
print(json.dumps({"events": events, "refused": refused, "seen": seen}))
"""


def test_two_processes_changing_at_once_never_lose_or_repeat_a_change(deploy_home: Path, pair: BundlePair) -> None:
    rounds = 25
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CHANGER, str(deploy_home), bundle_id, str(rounds)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for bundle_id in (pair.a.id, pair.b.id)
    ]
    results = []
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline() == "ready\n", process.communicate()
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        # Meanwhile, a third process (this one) reads the pointer: it always parses.
        reader, reads = Deployments(deploy_home), 0
        while any(process.poll() is None for process in processes):
            assert reader.current()["sequence"] >= 0
            reads += 1
        for process in processes:
            out, err = process.communicate()
            assert process.returncode == 0, err
            results.append(json.loads(out))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert reads > 0

    events = [e for result in results for e in result["events"]]
    # Each process made 2 * rounds attempts; every one either changed the state or was refused.
    assert [len(r["events"]) + r["refused"] for r in results] == [2 * rounds, 2 * rounds]
    assert sorted(e["sequence"] for e in events) == list(range(1, len(events) + 1))
    history = Deployments(deploy_home).history()
    assert history == sorted(events, key=lambda e: e["sequence"])
    for result in results:  # each process saw the sequence only move forward
        assert result["seen"] == sorted(result["seen"])
    current = Deployments(deploy_home).current()
    assert current["sequence"] == len(events)
    assert replay(history) == (current["bundle_id"], current["stack"])
    assert Deployments(deploy_home).status()["unapplied"] == []
