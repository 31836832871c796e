"""Rollback readiness: `aieng deploy check-rollback` verifies the rollback target (re-hash, load,
replay goldens) and records it; `aieng deploy status` shows the target's integrity and the last
check, fresh or stale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aieng_core.bundle.serving_bundle import GOLDEN_FILE, KIND
from aieng_core.deploy.deployments import Deployments
from aieng_core.deploy.rollback_readiness import check_rollback_target
from aieng_core.store.rollback_check import KEYS, check_path, read_check
from tests.core.deploy import BundlePair
from tests.core.deploy.helpers import aieng, flip_one_byte, snapshot

CHECK_KEYS = sorted(KEYS)


def goldens_of(pair: BundlePair) -> int:
    return len(json.loads((pair.a.path / GOLDEN_FILE).read_text(encoding="utf-8"))["outputs"])


def promoted_a_then_b(home: Path, pair: BundlePair) -> Deployments:
    deployments = Deployments(home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    deployments.promote(pair.b.id, actor="tester", verify=False)
    return deployments


def test_check_rollback_of_a_ready_target(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    deployments = promoted_a_then_b(deploy_home, pair)
    before = snapshot(deploy_home / "deployments" / "production")
    code, out, err = aieng(capsys, deploy_home, "deploy", "check-rollback", "--json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert sorted(result) == CHECK_KEYS
    assert {key: result[key] for key in ("pointer", "sequence", "bundle_id", "ok", "problems", "goldens_checked")} == {
        "pointer": "production",
        "sequence": 2,
        "bundle_id": pair.a.id,
        "ok": True,
        "problems": [],
        "goldens_checked": goldens_of(pair),
    }
    assert goldens_of(pair) == 5 and result["seconds"] > 0 and result["checked_at"].endswith("+00:00")
    assert read_check(deploy_home) == result  # what every view reads
    assert check_path(deploy_home) == deploy_home / "deployments" / "production" / "rollback-check.json"
    after = snapshot(deploy_home / "deployments" / "production")
    assert {name: data for name, data in after.items() if name != "rollback-check.json"} == before

    code, out, err = aieng(capsys, deploy_home, "deploy", "check-rollback")
    assert (code, err) == (0, "")
    assert out.startswith(
        f"rollback target of production (sequence 2): {pair.a.id} is ready: re-hashed, loaded, 5 goldens replayed in "
    )
    # status shows it, fresh; a change of the pointer makes it stale (it checked another stack).
    previous = deployments.status()["previous"]
    last = read_check(deploy_home)
    assert last is not None and last["sequence"] == 2
    assert (previous["bundle_id"], previous["integrity"]) == (pair.a.id, "ok")
    assert previous["rollback_check"] == {**last, "stale": False}
    deployments.rollback(actor="tester", verify=False)
    deployments.promote(pair.b.id, actor="tester", verify=False, allow_withdrawn=True)
    assert deployments.status()["previous"]["rollback_check"]["stale"] is True
    code, out, _ = aieng(capsys, deploy_home, "deploy", "status")
    assert code == 0
    lines = out.splitlines()
    assert lines[3:6] == [
        f"  previous: {pair.a.id} (a rollback makes it current again)",
        "            files: ok",
        f"            readiness check: ready at {last['checked_at']} (5 goldens replayed)  "
        "[stale: the pointer changed since; run it again]",
    ]


def test_check_rollback_of_a_damaged_target(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    promoted_a_then_b(deploy_home, pair)
    damaged = deploy_home / "artifacts" / KIND / pair.a.id / "model.safetensors"
    flip_one_byte(damaged)
    problem = f"{damaged}: sha256 does not match the manifest"
    code, out, err = aieng(capsys, deploy_home, "deploy", "check-rollback", "--json")
    assert code == 1
    assert err == f"aieng: error: production's rollback target {pair.a.id} is not ready: {problem}\n"
    result = json.loads(out)
    assert (result["bundle_id"], result["ok"], result["problems"], result["goldens_checked"]) == (
        pair.a.id,
        False,
        [problem],
        0,
    )
    assert read_check(deploy_home) == result

    code, out, _ = aieng(capsys, deploy_home, "deploy", "check-rollback")
    assert code == 1
    assert out == (
        f"rollback target of production (sequence 2): {pair.a.id} is NOT READY: a rollback to it is refused\n"
        f"  {problem}\n"
    )
    status = Deployments(deploy_home).status()["previous"]
    assert status["integrity"] == problem
    assert {key: status["rollback_check"][key] for key in ("ok", "problems", "stale")} == {
        "ok": False,
        "problems": [problem],
        "stale": False,
    }
    code, out, _ = aieng(capsys, deploy_home, "deploy", "status")
    assert code == 0
    assert out.splitlines()[4:6] == [
        f"            files: DAMAGED: {problem} (a rollback is refused)",
        f"            readiness check: NOT READY at {status['rollback_check']['checked_at']}: {problem}",
    ]


def test_check_rollback_of_a_missing_target(deploy_home: Path, pair: BundlePair) -> None:
    promoted_a_then_b(deploy_home, pair)
    directory = deploy_home / "artifacts" / KIND / pair.a.id
    for path in sorted(directory.iterdir()):
        path.unlink()
    directory.rmdir()
    result = check_rollback_target(deploy_home)
    assert (result["bundle_id"], result["ok"], result["problems"]) == (
        pair.a.id,
        False,
        [f"{directory / 'manifest.json'}: missing ({KIND} {pair.a.id} is not in the store)"],
    )
    assert Deployments(deploy_home).status()["previous"]["integrity"] == "missing"


def test_check_rollback_with_nothing_to_roll_back_to(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    code, out, err = aieng(capsys, deploy_home, "deploy", "check-rollback")
    assert (code, out, err) == (0, "rollback target of production (sequence 0): nothing to roll back to\n", "")
    Deployments(deploy_home).promote(pair.a.id, actor="tester", verify=False)
    code, out, err = aieng(capsys, deploy_home, "deploy", "check-rollback", "--json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert {key: result[key] for key in ("sequence", "bundle_id", "ok", "problems", "goldens_checked")} == {
        "sequence": 1,
        "bundle_id": None,
        "ok": None,
        "problems": [],
        "goldens_checked": 0,
    }
    assert Deployments(deploy_home).status()["previous"] is None


def test_check_rollback_of_another_pointer_and_a_damaged_result(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    drill = Deployments(deploy_home, "drill")
    drill.promote(pair.b.id, actor="tester", verify=False)
    drill.promote(pair.a.id, actor="tester", verify=False)
    code, out, _ = aieng(capsys, deploy_home, "deploy", "check-rollback", "--pointer", "drill", "--json")
    assert (code, json.loads(out)["pointer"], json.loads(out)["bundle_id"]) == (0, "drill", pair.b.id)
    assert read_check(deploy_home) is None and read_check(deploy_home, "drill")["ok"] is True
    # A damaged result is not a passed check: status shows it failed, naming the file.
    check_path(deploy_home, "drill").write_text("{", encoding="utf-8")
    shown = drill.status()["previous"]["rollback_check"]
    assert (shown["ok"], shown["stale"]) == (False, True)
    assert shown["problems"][0].startswith(f"{check_path(deploy_home, 'drill')}: not valid JSON")
