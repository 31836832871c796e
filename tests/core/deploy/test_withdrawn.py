"""A rolled-back bundle stays withdrawn: a promote of it is refused naming the rollback (and
changes nothing) unless asked explicitly, which the history records; a rollback never lands on
it; the withdrawal is read from the applied history, older histories included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aieng_core.bundle.serving_bundle import KIND, build_serving_bundle
from aieng_core.deploy.deployments import BundleWithdrawn, DeploymentError, Deployments, withdrawn_refusal
from aieng_core.store import ArtifactStore
from aieng_core.store import pointers as pointers_module
from aieng_core.store.pointers import DeploymentStateError
from tests.bundle_fixtures import BundledHome
from tests.core.deploy import BundlePair, replay
from tests.core.deploy.helpers import aieng, snapshot


def production_dir(home: Path) -> Path:
    return home / "deployments" / "production"


def rolled_back(home: Path, pair: BundlePair) -> tuple[Deployments, dict]:
    """A promoted, then B, then a rollback by bob@host: B is withdrawn."""
    deployments = Deployments(home)
    deployments.promote(pair.a.id, actor="ann@host", verify=False)
    deployments.promote(pair.b.id, actor="ann@host", verify=False)
    back = deployments.rollback(actor="bob@host", reason="quality regression", verify=False)
    return deployments, back


def test_a_rollback_withdraws_the_bundle_it_left(deploy_home: Path, pair: BundlePair) -> None:
    deployments, back = rolled_back(deploy_home, pair)
    assert (back["action"], back["from"], back["to"], back["withdrawn"], back["skipped_withdrawn"]) == (
        "rollback",
        pair.b.id,
        pair.a.id,
        pair.b.id,
        [],
    )
    assert deployments.withdrawn() == {pair.b.id: back}
    assert deployments.withdrawal(pair.b.id) == back
    assert deployments.withdrawal(pair.a.id) is None
    assert deployments.status()["withdrawn"] == [
        {
            "bundle_id": pair.b.id,
            "sequence": 3,
            "time": back["time"],
            "actor": "bob@host",
            "reason": "quality regression",
        }
    ]
    deployments.refuse_withdrawn(pair.a.id)  # A is not withdrawn: nothing raised
    with pytest.raises(BundleWithdrawn) as refused:
        deployments.refuse_withdrawn(pair.b.id)
    assert (refused.value.bundle_id, refused.value.event) == (pair.b.id, back)


def test_a_promote_of_a_withdrawn_bundle_is_refused_naming_the_rollback(deploy_home: Path, pair: BundlePair) -> None:
    deployments, back = rolled_back(deploy_home, pair)
    before = snapshot(production_dir(deploy_home))
    for verify in (True, False):
        with pytest.raises(BundleWithdrawn) as refused:
            deployments.promote(pair.b.id, actor="carol@host", verify=verify)
        assert isinstance(refused.value, DeploymentError)
        assert str(refused.value) == (
            f"{KIND} {pair.b.id} was withdrawn from production by the rollback at {back['time']} (sequence 3, by "
            "bob@host: 'quality regression'); it is not promoted again unless asked explicitly (--allow-withdrawn)"
        )
        assert str(refused.value) == withdrawn_refusal(pair.b.id, back, "production")
        assert snapshot(production_dir(deploy_home)) == before
    no_reason = {**back, "reason": ""}
    assert "(sequence 3, by bob@host, no reason given);" in withdrawn_refusal(pair.b.id, no_reason, "production")


def test_the_cli_refuses_a_withdrawn_bundle_in_one_line_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    _, back = rolled_back(deploy_home, pair)
    before = snapshot(production_dir(deploy_home))
    for flags in ([], ["--json"]):
        code, out, err = aieng(capsys, deploy_home, "deploy", "promote", pair.b.id, *flags)
        assert (code, out) == (1, "")
        assert err == (
            f"aieng: error: {KIND} {pair.b.id} was withdrawn from production by the rollback at {back['time']} "
            "(sequence 3, by bob@host: 'quality regression'); it is not promoted again unless asked explicitly "
            "(--allow-withdrawn)\n"
        )
        assert snapshot(production_dir(deploy_home)) == before


def test_allow_withdrawn_promotes_and_records_it(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    deployments, _ = rolled_back(deploy_home, pair)
    code, out, err = aieng(
        capsys, deploy_home, "deploy", "promote", pair.b.id, "--allow-withdrawn", "--reason", "fixed", "--json"
    )
    assert (code, err) == (0, "")
    result = json.loads(out)
    event = result["event"]
    assert (event["sequence"], event["from"], event["to"], event["reason"]) == (4, pair.a.id, pair.b.id, "fixed")
    assert (event["allow_withdrawn"], event["overrode_withdrawal"]) == (True, 3)
    assert (result["current"]["bundle_id"], result["withdrawn"]) == (pair.b.id, [])
    assert deployments.withdrawn() == {}
    assert deployments.history()[-1] == event
    # Withdrawal is per pointer: B was never withdrawn from "other", so nothing is overridden there.
    deployments.rollback(actor="tester", verify=False)  # withdraws B again
    assert list(deployments.withdrawn()) == [pair.b.id]
    elsewhere = Deployments(deploy_home, "other").promote(pair.b.id, verify=False, allow_withdrawn=True)
    assert (elsewhere["allow_withdrawn"], elsewhere["overrode_withdrawal"]) == (True, None)


def test_a_rollback_of_a_withdrawn_bundles_successor_never_lands_on_it(deploy_home: Path, pair: BundlePair) -> None:
    """B, promoted twice, is rolled back (withdrawn) while an older B is still on the stack
    below A, its successor: a rollback of A passes over B (refused: nothing else to land on;
    with allow_empty, no bundle at all). B is never made current again."""
    deployments, _ = rolled_back(deploy_home, pair)  # A current, stack [], B withdrawn
    deployments.promote(pair.b.id, actor="tester", verify=False, allow_withdrawn=True)  # B, stack [A]
    deployments.promote(pair.a.id, actor="tester", verify=False)  # A, stack [A, B]
    deployments.promote(pair.b.id, actor="tester", verify=False)  # B, stack [A, B, A]
    withdraws_b = deployments.rollback(actor="tester", verify=False)
    assert (withdraws_b["to"], deployments.current()["stack"]) == (pair.a.id, [pair.a.id, pair.b.id])
    assert list(deployments.withdrawn()) == [pair.b.id]
    assert deployments.rollback_target() is None  # B withdrawn, A current: nothing to land on
    assert deployments.status()["previous"] is None
    with pytest.raises(DeploymentError, match=r"^nothing to roll back to: the bundles on production's stack"):
        deployments.rollback(actor="tester")
    emptied = deployments.rollback(actor="tester", allow_empty=True)
    assert (emptied["to"], emptied["skipped_withdrawn"]) == (None, [pair.b.id, pair.a.id])
    assert all(e["to"] != pair.b.id for e in deployments.history() if e["action"] == "rollback")
    assert replay(deployments.history()) == (None, [])


def test_a_retrain_giving_the_same_bundle_id_stays_withdrawn(
    serving_bundle_artifact: BundledHome, copy_bundled_home, pair: BundlePair
) -> None:
    """Ids come from recipes: rebuilding B's recipe gives B's id, the same bundle, still withdrawn."""
    store: ArtifactStore = copy_bundled_home(serving_bundle_artifact)
    shutil.copytree(pair.b.path, store.artifact_dir(KIND, pair.b.id))
    deployments = Deployments(store.home)
    deployments.promote(serving_bundle_artifact.bundle.id, actor="tester", verify=False)
    deployments.promote(pair.b.id, actor="tester", verify=False)
    deployments.rollback(actor="tester", verify=False)
    shutil.rmtree(store.artifact_dir(KIND, pair.b.id))  # gone: the retrain builds it from scratch
    recipe = serving_bundle_artifact.config.bundle.model_copy(update={"max_batch": 8})  # B's recipe
    rebuilt = build_serving_bundle(store, serving_bundle_artifact.config.model_copy(update={"bundle": recipe}))
    assert rebuilt.id == pair.b.id and store.verify(rebuilt) == []
    with pytest.raises(BundleWithdrawn, match=f"^{KIND} {pair.b.id} was withdrawn from production by the rollback"):
        deployments.promote(rebuilt.id, actor="tester")


def test_an_older_history_without_the_keys_withdraws_the_rollbacks_from(deploy_home: Path, pair: BundlePair) -> None:
    """Histories written before events carried `withdrawn`: a rollback withdrew its `from`."""
    deployments, _ = rolled_back(deploy_home, pair)
    history = production_dir(deploy_home) / "history.jsonl"
    old_keys = ("withdrawn", "skipped_withdrawn", "allow_withdrawn", "overrode_withdrawal")
    lines = [json.loads(line) for line in history.read_text(encoding="utf-8").splitlines()]
    old = [{key: value for key, value in event.items() if key not in old_keys} for event in lines]
    history.write_text("".join(json.dumps(event) + "\n" for event in old), encoding="utf-8")
    assert list(deployments.withdrawn()) == [pair.b.id]
    assert deployments.withdrawal(pair.b.id) == old[2]
    with pytest.raises(BundleWithdrawn):
        deployments.promote(pair.b.id, verify=False)


def test_a_withdrawal_key_of_the_wrong_type_is_a_damaged_line(deploy_home: Path, pair: BundlePair) -> None:
    rolled_back(deploy_home, pair)
    history = production_dir(deploy_home) / "history.jsonl"
    lines = history.read_text(encoding="utf-8").splitlines()
    event = json.loads(lines[2])
    for key, value, problem in (
        ("withdrawn", "../b", "withdrawn '../b' is not null or a valid bundle id"),
        ("skipped_withdrawn", "b", "skipped_withdrawn 'b' is not a list of valid bundle ids"),
        ("allow_withdrawn", 1, "allow_withdrawn 1 is not true or false"),
        ("overrode_withdrawal", "3", "overrode_withdrawal '3' is not null or a positive integer"),
    ):
        history.write_text("\n".join([*lines[:2], json.dumps({**event, key: value})]) + "\n", encoding="utf-8")
        with pytest.raises(DeploymentStateError) as damaged:
            Deployments(deploy_home).withdrawn()
        assert str(damaged.value).startswith(f"{history}, line 3: {problem}; repair the line by hand")


def test_a_crashed_rollback_withdraws_nothing(
    deploy_home: Path, pair: BundlePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback line whose change never reached current.json was never applied: B serves, and
    is not withdrawn."""
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    deployments.promote(pair.b.id, actor="tester", verify=False)
    real_write = pointers_module.atomic_write_bytes

    def crash_before_current(path: Path, data: bytes) -> None:
        if path.name == "current.json":
            raise OSError("the machine lost power")
        real_write(path, data)

    monkeypatch.setattr(pointers_module, "atomic_write_bytes", crash_before_current)
    with pytest.raises(OSError, match="lost power"):
        deployments.rollback(actor="tester", verify=False)
    monkeypatch.undo()
    status = deployments.status()
    assert (status["current"]["bundle_id"], status["unapplied"], status["withdrawn"]) == (pair.b.id, [3], [])
    assert deployments.withdrawn() == {}


def test_a_withdrawal_made_while_a_promote_verified_is_refused_under_the_lock(
    deploy_home: Path, pair: BundlePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While promote(B) verifies B (outside the lock), someone else promotes B and rolls it back:
    under the lock the promote sees the withdrawal and changes nothing."""
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    other = Deployments(deploy_home)
    real_verify = Deployments._verify
    seen: list[int] = []

    def verify_meanwhile(self: Deployments, artifact, refusal: str) -> None:
        real_verify(self, artifact, refusal)
        other.promote(pair.b.id, actor="other", verify=False)
        seen.append(other.rollback(actor="other", reason="meanwhile", verify=False)["sequence"])

    monkeypatch.setattr(Deployments, "_verify", verify_meanwhile)
    with pytest.raises(BundleWithdrawn, match=r"\(sequence 3, by other: 'meanwhile'\)"):
        deployments.promote(pair.b.id, actor="tester")
    monkeypatch.undo()
    assert seen == [3]
    assert [e["sequence"] for e in deployments.history()] == [1, 2, 3]
    assert deployments.current()["bundle_id"] == pair.a.id
