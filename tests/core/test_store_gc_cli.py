"""`aieng store pin|unpin|pins` and `aieng store gc [--dry-run] [--json]` from the command line,
on the crafted store of tests/core/gc_helpers.py; the `store:` config section they read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aieng_core.config import ConfigError, load_config
from aieng_core.deploy.deployments import default_actor
from aieng_core.store import ArtifactNotFound
from aieng_core.store.pins import PinError, pin, pins, unpin
from tests.conftest import TINY_CONFIG
from tests.core.deploy.helpers import aieng
from tests.core.gc_helpers import GARBAGE, GcHome, dir_bytes, make_gc_home


@pytest.fixture
def gc_home(home: Path) -> GcHome:
    return make_gc_home(home)


def deleted(result: dict) -> list[tuple[str, str]]:
    return sorted((entry["kind"], entry["id"]) for entry in result["deleted"])


def test_pin_refuses_an_unknown_id_and_an_empty_reason(gc_home: GcHome, capsys: pytest.CaptureFixture) -> None:
    home = gc_home.home
    code, out, err = aieng(capsys, home, "store", "pin", "0123456789abcdef", "--reason", "keep it")
    assert (code, out) == (1, "")
    assert err == (
        f"aieng: error: cannot pin 0123456789abcdef: no artifact with that id under {home / 'artifacts'} "
        "(`aieng lineage ID` and `aieng store gc --dry-run --json` list the ids there are)\n"
    )
    code, out, err = aieng(capsys, home, "store", "pin", gc_home.a["raw_old"].id, "--reason", "  ")
    assert (code, out) == (1, "")
    assert err.startswith(f"aieng: error: cannot pin {gc_home.a['raw_old'].id}: give the reason")
    code, _, err = aieng(capsys, home, "store", "unpin", gc_home.a["raw_old"].id)
    assert code == 1 and err == (
        f"aieng: error: {gc_home.a['raw_old'].id} is not pinned (no {home / 'pins' / gc_home.a['raw_old'].id}.json); "
        "`aieng store pins` lists the pins\n"
    )
    with pytest.raises(ArtifactNotFound, match="invalid artifact id"):
        pin(gc_home.store, "../escape", "why", "tester")
    assert [p["id"] for p in pins(home)] == [gc_home.a["clean_pin"].id]  # only the fixture's pin


def test_pin_keeps_what_it_reaches_and_unpin_lets_it_go(gc_home: GcHome, capsys: pytest.CaptureFixture) -> None:
    home, a = gc_home.home, gc_home.a
    code, out, err = aieng(capsys, home, "store", "pin", a["clean_old"].id, "--reason", "incident 42", "--json")
    assert (code, err) == (0, "")
    record = json.loads(out)
    assert {k: record[k] for k in ("id", "kind", "reason", "actor")} == {
        "id": a["clean_old"].id,
        "kind": "clean_documents",
        "reason": "incident 42",
        "actor": default_actor(),
    }
    code, out, _ = aieng(capsys, home, "store", "pins", "--json")
    assert code == 0 and [p["id"] for p in json.loads(out)["pins"]] == sorted([a["clean_old"].id, a["clean_pin"].id])

    # Pinned, clean_old keeps its raw input too: only the old bundle and its model would go.
    code, out, _ = aieng(capsys, home, "store", "gc", "--dry-run", "--json", "--keep-newer-than-days", "0")
    planned = json.loads(out)
    assert code == 0 and planned["dry_run"] is True
    assert deleted(planned) == gc_home.keys("old_bundle", "old_model")
    assert planned["bytes_freed"] == dir_bytes(a["old_bundle"].path) + dir_bytes(a["old_model"].path)
    assert all(a[name].path.is_dir() for name in GARBAGE)

    assert unpin(home, a["clean_old"].id)["reason"] == "incident 42"
    code, out, _ = aieng(capsys, home, "store", "gc", "--json", "--keep-newer-than-days", "0")
    assert code == 0 and deleted(json.loads(out)) == gc_home.keys(*GARBAGE)
    assert not any(a[name].path.exists() for name in GARBAGE)


def test_gc_human_output(gc_home: GcHome, capsys: pytest.CaptureFixture) -> None:
    home, a = gc_home.home, gc_home.a
    code, out, err = aieng(capsys, home, "store", "gc", "--dry-run", "--keep-newer-than-days", "0")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    total = sum(dir_bytes(a[name].path) for name in GARBAGE)
    expected = [
        f"  would delete {kind} {artifact_id} ({dir_bytes(home / 'artifacts' / kind / artifact_id):,} bytes)"
        for kind, artifact_id in gc_home.keys(*GARBAGE)
    ]
    assert lines[:-1] == expected
    assert lines[-1] == (
        f"store gc {home} (dry run): 4 artifacts would be deleted, {total:,} bytes would be freed; 7 kept, reached "
        "from roots (1 pointers, 2 rollback, 1 pins, 1 refs, 0 recent); 0 held, 0 unreadable"
    )
    # The default (configs/tiny.yaml has no store: section): a week. Everything here is newer.
    code, out, _ = aieng(capsys, home, "store", "gc")
    assert code == 0 and out.splitlines()[-1].startswith(f"store gc {home}: 0 artifacts deleted, 0 bytes freed")


def test_gc_reads_the_store_section_and_flags_override_it(
    gc_home: GcHome, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    home = gc_home.home
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["store"] = {"gc_keep_newer_than_days": 0, "gc_rollback_depth": 1}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    code, out, _ = aieng(capsys, home, "--config", str(path), "store", "gc", "--dry-run", "--json")
    assert code == 0 and deleted(json.loads(out)) == gc_home.keys("x", *GARBAGE)  # x: the stack's second
    code, out, _ = aieng(
        capsys, home, "--config", str(path), "store", "gc", "--dry-run", "--json", "--rollback-depth", "all"
    )
    assert code == 0 and deleted(json.loads(out)) == gc_home.keys(*GARBAGE)
    code, out, _ = aieng(
        capsys, home, "--config", str(path), "store", "gc", "--dry-run", "--json", "--keep-newer-than-days", "1"
    )
    assert code == 0 and deleted(json.loads(out)) == []

    config["store"] = {"gc_rollback_depth": -1}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match="store.gc_rollback_depth"):
        load_config(path)
    assert load_config(TINY_CONFIG).store.gc_keep_newer_than_days == 7.0


def test_gc_flags_are_checked_and_a_damaged_pin_refuses(gc_home: GcHome, capsys: pytest.CaptureFixture) -> None:
    home = gc_home.home
    for flag, value in (("--rollback-depth", "-1"), ("--keep-newer-than-days", "-2")):
        with pytest.raises(SystemExit) as usage:
            aieng(capsys, home, "store", "gc", flag, value)
        assert usage.value.code == 2
    pin_file = home / "pins" / f"{gc_home.a['clean_pin'].id}.json"
    pin_file.write_text("{}")
    code, out, err = aieng(capsys, home, "store", "gc", "--keep-newer-than-days", "0")
    assert (code, out) == (1, "")
    assert err.startswith(f"aieng: error: gc cannot tell what the pins keep: {pin_file}: not a pin")
    assert all(gc_home.a[name].path.is_dir() for name in GARBAGE)  # refused: nothing deleted
    with pytest.raises(PinError, match="not a pin"):
        unpin(home, gc_home.a["clean_pin"].id)
