"""A rollback verifies its target before the pointer moves: a damaged or missing target is
refused naming the file, exit status 1, and nothing changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aieng_core.bundle import verify as bundle_verify
from aieng_core.bundle.serving_bundle import KIND
from aieng_core.deploy.deployments import DeploymentError, Deployments
from tests.core.deploy import BundlePair
from tests.core.deploy.helpers import aieng, flip_one_byte, snapshot


def promoted_a_then_b(home: Path, pair: BundlePair) -> Deployments:
    deployments = Deployments(home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    deployments.promote(pair.b.id, actor="tester", verify=False)
    return deployments


@pytest.fixture
def verified(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The bundle paths verify_bundle is called on (it still runs)."""
    calls: list[Path] = []
    real = bundle_verify.verify_bundle

    def counting(path: str | Path) -> dict[str, Any]:
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(bundle_verify, "verify_bundle", counting)
    return calls


def test_a_rollback_verifies_its_target_first(deploy_home: Path, pair: BundlePair, verified: list[Path]) -> None:
    deployments = promoted_a_then_b(deploy_home, pair)
    back = deployments.rollback(actor="tester")
    assert (back["to"], verified) == (pair.a.id, [deploy_home / "artifacts" / KIND / pair.a.id])


@pytest.mark.parametrize("name", ["model.safetensors", "serving.json"])
def test_a_rollback_to_a_damaged_target_is_refused_naming_the_file(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair, name: str
) -> None:
    deployments = promoted_a_then_b(deploy_home, pair)
    directory = deploy_home / "deployments" / "production"
    before = snapshot(directory)
    damaged = deploy_home / "artifacts" / KIND / pair.a.id / name
    flip_one_byte(damaged)
    with pytest.raises(DeploymentError) as refused:
        deployments.rollback(actor="tester", reason="incident")
    assert str(refused.value) == (
        f"refusing to roll production back to {KIND} {pair.a.id}: {damaged}: sha256 does not match the manifest; "
        f"nothing changed (`aieng bundle verify {damaged.parent}` lists every problem)"
    )
    assert snapshot(directory) == before  # current.json and history.jsonl, byte for byte

    for flags in ([], ["--json"]):
        code, out, err = aieng(capsys, deploy_home, "deploy", "rollback", "--reason", "incident", *flags)
        assert (code, out) == (1, "")
        assert err == f"aieng: error: {refused.value}\n"
        assert snapshot(directory) == before
    assert deployments.current()["bundle_id"] == pair.b.id and deployments.withdrawn() == {}


def test_a_rollback_to_a_missing_target_is_refused_naming_the_manifest(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    promoted_a_then_b(deploy_home, pair)
    manifest = deploy_home / "artifacts" / KIND / pair.a.id / "manifest.json"
    manifest.unlink()
    directory = deploy_home / "deployments" / "production"
    before = snapshot(directory)
    code, out, err = aieng(capsys, deploy_home, "deploy", "rollback")
    assert (code, out) == (1, "")
    assert err.startswith(f"aieng: error: cannot roll production back to '{pair.a.id}': no {KIND} ")
    assert f"({manifest} is missing)" in err and err.count("\n") == 1
    assert snapshot(directory) == before


def test_a_rollback_to_no_bundle_verifies_nothing(deploy_home: Path, pair: BundlePair, verified: list[Path]) -> None:
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    flip_one_byte(deploy_home / "artifacts" / KIND / pair.a.id / "model.safetensors")  # what it leaves
    emptied = deployments.rollback(actor="tester", allow_empty=True)
    assert (emptied["to"], verified) == (None, [])


def test_a_pointer_that_changes_while_the_target_is_checked_is_refused(
    deploy_home: Path, pair: BundlePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target is verified outside the lock; under it the target must still be the one checked."""
    deployments = promoted_a_then_b(deploy_home, pair)
    other = Deployments(deploy_home)
    real_verify = Deployments._verify

    def verify_meanwhile(self: Deployments, artifact: Any, refusal: str) -> None:
        real_verify(self, artifact, refusal)
        other.rollback(actor="other", verify=False)  # B -> A: a rollback now would go to no bundle

    monkeypatch.setattr(Deployments, "_verify", verify_meanwhile)
    with pytest.raises(DeploymentError) as refused:
        deployments.rollback(actor="tester", allow_empty=True)
    monkeypatch.undo()
    assert str(refused.value) == (
        f"production changed while {pair.a.id} was being checked: a rollback now goes to no bundle "
        "(sequence 3); nothing changed"
    )
    assert [(e["sequence"], e["actor"]) for e in deployments.history()] == [(1, "tester"), (2, "tester"), (3, "other")]
