"""`aieng deploy status|promote|rollback`: the handlers behind the parser add_deploy_parser
builds, driven as `aieng` will drive them (args.handler(args))."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from aieng_core.bundle.serving_bundle import KIND
from aieng_core.cli.deploy import add_parsers as add_deploy_parser
from aieng_core.deploy.deployments import Deployments
from tests.bundle_fixtures import BundledHome
from tests.conftest import TINY_CONFIG
from tests.core.deploy import BundlePair, build_bundle_pair, home_with_bundles

STATUS_KEYS = [
    "canary", "canary_history", "current", "history", "pointer", "previous", "sequence", "stack", "torn_tail",
    "unapplied", "withdrawn",
]  # fmt: skip


@pytest.fixture(scope="module")
def pair(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> BundlePair:
    return build_bundle_pair(tmp_path_factory.mktemp("deploy-cli-pair"), serving_bundle_artifact)


@pytest.fixture
def deploy_home(pair: BundlePair, tmp_path: Path) -> Path:
    return home_with_bundles(tmp_path / "deploy-home", pair)


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="aieng")
    built.add_argument("--home")
    built.add_argument("--config")
    sub = built.add_subparsers(dest="command", required=True)
    add_deploy_parser(sub)
    return built


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    args = parser().parse_args(list(argv))
    code = args.handler(args)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, "--home", str(home), "deploy", *argv, "--json")
    assert (code, err) == (0, "")
    return json.loads(out)  # exactly one JSON document: json.loads refuses anything after it


def test_status_json_when_nothing_is_deployed(capsys: pytest.CaptureFixture[str], deploy_home: Path) -> None:
    assert run_json(capsys, deploy_home, "status") == {
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


def test_promote_promote_rollback_json(capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair) -> None:
    first = run_json(capsys, deploy_home, "promote", pair.a.id, "--reason", "first release")
    assert sorted(first) == sorted(["event", *STATUS_KEYS])
    assert {key: first["event"][key] for key in ("sequence", "action", "from", "to", "reason", "pointer")} == {
        "sequence": 1,
        "action": "promote",
        "from": None,
        "to": pair.a.id,
        "reason": "first release",
        "pointer": "production",
    }
    assert first["current"] == {
        "bundle_id": pair.a.id,
        "bundle_path": str(deploy_home / "artifacts" / KIND / pair.a.id),
        "in_store": True,
        "since": first["event"]["time"],
        "sequence": 1,
    }
    assert (first["previous"], first["history"]) == (None, [first["event"]])

    second = run_json(capsys, deploy_home, "promote", pair.b.id)
    assert (second["current"]["bundle_id"], second["previous"]["bundle_id"]) == (pair.b.id, pair.a.id)

    back = run_json(capsys, deploy_home, "rollback", "--reason", "latency regression")
    assert {key: back["event"][key] for key in ("sequence", "action", "from", "to", "reason")} == {
        "sequence": 3,
        "action": "rollback",
        "from": pair.b.id,
        "to": pair.a.id,
        "reason": "latency regression",
    }
    assert (back["current"]["bundle_id"], back["previous"], back["stack"]) == (pair.a.id, None, [])
    assert back["withdrawn"] == [
        {
            "bundle_id": pair.b.id,
            "sequence": 3,
            "time": back["event"]["time"],
            "actor": back["event"]["actor"],
            "reason": "latency regression",
        }
    ]
    assert [(e["sequence"], e["action"], e["to"]) for e in back["history"]] == [
        (1, "promote", pair.a.id),
        (2, "promote", pair.b.id),
        (3, "rollback", pair.a.id),
    ]
    assert run_json(capsys, deploy_home, "status") == {key: back[key] for key in STATUS_KEYS}


def test_human_status_shows_current_previous_and_history(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    code, out, err = run(capsys, "--home", str(deploy_home), "deploy", "status")
    assert (code, err) == (0, "")
    assert out == (
        "deployment pointer production (sequence 0)\n"
        "  current:  (no bundle deployed)\n"
        "  previous: (none: nothing to roll back to)\n"
        "history: empty\n"
    )
    deployments = Deployments(deploy_home)
    first = deployments.promote(pair.a.id, actor="ann@host", reason="first", verify=False)
    second = deployments.promote(pair.b.id, actor="bob@host", verify=False)
    code, out, err = run(capsys, "--home", str(deploy_home), "deploy", "status")
    assert (code, err) == (0, "")
    assert out == (
        "deployment pointer production (sequence 2)\n"
        f"  current:  {pair.b.id} since {second['time']}\n"
        f"            {deploy_home / 'artifacts' / KIND / pair.b.id}\n"
        f"  previous: {pair.a.id} (a rollback makes it current again)\n"
        "            files: ok\n"
        "            readiness check: never run (`aieng deploy check-rollback` runs it)\n"
        "history: 2 changes\n"
        f"  #1    {first['time']}  promote  (none) -> {pair.a.id}  by ann@host: first\n"
        f"  #2    {second['time']}  promote  {pair.a.id} -> {pair.b.id}  by bob@host\n"
    )


def test_human_status_shows_the_last_ten_changes(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    deployments = Deployments(deploy_home)
    deployments.promote(pair.a.id, actor="tester", verify=False)
    for _ in range(6):
        deployments.promote(pair.b.id, actor="tester", verify=False, allow_withdrawn=True)
        deployments.rollback(actor="tester", verify=False)
    code, out, _ = run(capsys, "--home", str(deploy_home), "deploy", "status")
    lines = out.splitlines()
    assert code == 0
    assert lines[4:6] == [
        "withdrawn (a promote refuses them unless --allow-withdrawn):",
        f"  {pair.b.id} by the rollback #13 at {deployments.history()[-1]['time']} by tester",
    ]
    assert lines[6] == "history: 13 changes, the last 10 shown"
    assert [line.split()[0] for line in lines[7:]] == [f"#{n}" for n in range(4, 14)]


def test_human_promote_and_rollback(capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair) -> None:
    code, out, err = run(capsys, "--home", str(deploy_home), "deploy", "promote", pair.a.id)
    assert (code, err) == (0, "")
    assert out.splitlines()[:2] == [
        f"promoted production: (none) -> {pair.a.id} (sequence 1)",
        "deployment pointer production (sequence 1)",
    ]
    code, out, err = run(capsys, "--home", str(deploy_home), "deploy", "rollback", "--allow-empty")
    assert (code, err) == (0, "")
    assert out.splitlines()[:3] == [
        f"rolled back production: {pair.a.id} -> (none) (sequence 2)",
        "deployment pointer production (sequence 2)",
        "  current:  (no bundle deployed)",
    ]


@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_refusals_exit_1_with_one_line_and_change_nothing(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair, as_json: bool
) -> None:
    flags = ["--json"] if as_json else []
    home = ["--home", str(deploy_home)]
    code, out, err = run(capsys, *home, "deploy", "rollback", *flags)
    assert (code, out, err) == (
        1,
        "",
        "aieng: error: nothing is deployed on production: there is nothing to roll back\n",
    )

    code, out, err = run(capsys, *home, "deploy", "promote", "0123456789abcdef", *flags)
    assert (code, out) == (1, "")
    assert err.startswith("aieng: error: cannot promote '0123456789abcdef' on production: no serving_bundle")
    assert err.count("\n") == 1

    Deployments(deploy_home).promote(pair.a.id, actor="tester", verify=False)
    before = (deploy_home / "deployments" / "production" / "current.json").read_bytes()
    code, out, err = run(capsys, *home, "deploy", "promote", pair.a.id, *flags)
    assert (code, out) == (1, "")
    assert err.startswith(f"aieng: error: {KIND} {pair.a.id} is already current on production")
    assert err.count("\n") == 1
    code, out, err = run(capsys, *home, "deploy", "rollback", *flags)
    assert (code, out) == (1, "")
    assert err.startswith(f"aieng: error: nothing to roll back to: {pair.a.id} is the only bundle")
    assert (deploy_home / "deployments" / "production" / "current.json").read_bytes() == before

    (deploy_home / "deployments" / "production" / "current.json").write_bytes(b"{")
    code, out, err = run(capsys, *home, "deploy", "status", *flags)
    assert (code, out) == (1, "")
    assert err.startswith(
        f"aieng: error: {deploy_home / 'deployments' / 'production' / 'current.json'}: not valid JSON"
    )
    assert err.count("\n") == 1


def test_a_tampered_bundle_is_refused_by_the_cli(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    damaged = deploy_home / "artifacts" / KIND / pair.b.id / "tokenizer.json"
    damaged.write_bytes(damaged.read_bytes() + b" ")
    code, out, err = run(capsys, "--home", str(deploy_home), "deploy", "promote", pair.b.id)
    assert (code, out) == (1, "")
    assert err.startswith(
        f"aieng: error: refusing to promote {KIND} {pair.b.id} on production: {damaged}: sha256 does not match"
    )
    assert not (deploy_home / "deployments" / "production" / "current.json").exists()


def test_the_pointer_option_and_the_home_from_the_environment(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIENG_HOME", str(deploy_home))  # no --home: resolve_home reads $AIENG_HOME
    code, out, err = run(capsys, "deploy", "promote", pair.a.id, "--pointer", "drill", "--json")
    assert (code, err) == (0, "")
    drill = json.loads(out)
    assert (drill["pointer"], drill["event"]["pointer"], drill["current"]["bundle_id"]) == ("drill", "drill", pair.a.id)
    assert sorted(path.name for path in (deploy_home / "deployments").iterdir()) == ["drill"]
    code, out, _ = run(capsys, "deploy", "status", "--json")
    assert (code, json.loads(out)["current"]) == (0, None)  # production is untouched

    code, out, err = run(capsys, "deploy", "status", "--pointer", "../production")
    assert (code, out) == (1, "")
    assert err.startswith("aieng: error: invalid deployment pointer '../production'")


def test_the_parser_requires_a_subcommand_and_a_bundle_id(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["deploy"], ["deploy", "promote"]):
        with pytest.raises(SystemExit) as usage:
            parser().parse_args(argv)
        assert usage.value.code == 2
    args = parser().parse_args(["deploy", "promote", "abc", "--reason", "why", "--pointer", "drill"])
    assert (args.bundle_id, args.reason, args.pointer, args.json) == ("abc", "why", "drill", False)
    args = parser().parse_args(["deploy", "rollback"])
    assert (args.reason, args.pointer, args.allow_empty, args.json) == ("", "production", False, False)


def test_gate_refuses_a_tampered_bundle_at_verify_and_leaves_production_alone(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    Deployments(deploy_home).promote(pair.a.id, verify=False)
    before = Deployments(deploy_home).status()
    served = deploy_home / "artifacts" / KIND / pair.b.id / "serving.json"
    served.write_text(served.read_text(encoding="utf-8") + " ", encoding="utf-8")
    code, out, err = run(capsys, "--home", str(deploy_home), "--config", str(TINY_CONFIG), "deploy", "gate", pair.b.id)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith("aieng: error: gate failed at verify: problems")
    assert "serving.json" in err and err.rstrip().endswith("production unchanged")
    assert Deployments(deploy_home).status() == before
    report = json.loads(Path(err.split("(report: ")[1].split(")")[0]).read_text(encoding="utf-8"))
    assert (report["passed"], report["failure"]["step"], report["event"]) == (False, "verify", None)
    assert [(step["name"], step["passed"]) for step in report["steps"]] == [("verify", False)]


def test_gate_of_what_production_serves_is_refused(
    capsys: pytest.CaptureFixture[str], deploy_home: Path, pair: BundlePair
) -> None:
    Deployments(deploy_home).promote(pair.a.id, verify=False)
    code, out, err = run(capsys, "--home", str(deploy_home), "--config", str(TINY_CONFIG), "deploy", "gate", pair.a.id)
    assert (code, out) == (1, "")
    assert err == f"aieng: error: production already serves serving_bundle {pair.a.id} (sequence 1): nothing to gate\n"
    code, _, err = run(capsys, "--home", str(deploy_home), "deploy", "gate", "0123456789abcdef")
    assert code == 1 and "0123456789abcdef" in err and err.count("\n") == 1
