"""`aieng store rebuild ID`: an artifact deleted by hand (or gc'd) is built again from its
recorded recipe, with the same id and content hash, its missing inputs first; what cannot give
that artifact (a changed landed file, another code version, a build that is not reproducible)
is refused naming exactly what. Real artifacts from the session fixtures, on copies."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aieng_core.cli import main
from aieng_core.cli.rebuild import builders, config_loader
from aieng_core.config import load_config
from aieng_core.home import raw_partition_dir
from aieng_core.store import ArtifactStore
from aieng_core.store.gc import collect_garbage
from aieng_core.store.rebuild import RebuildRefused, rebuild
from aieng_core.store.recipes import RECIPES_DIR, read_recipe, recipe_path
from aieng_core.store.verify import verify_store
from tests.bundle_fixtures import BundledHome, TrainedHome
from tests.conftest import TINY_CONFIG
from tests.core.helpers import BuiltHome

PARTITION = "2026-01-02"


def refs_of(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted((home / "refs").rglob("*.json"))}


def do_rebuild(store: ArtifactStore, artifact_id: str) -> dict:
    return rebuild(store, artifact_id, builders(), config_loader(str(TINY_CONFIG)))


def cli(capsys: pytest.CaptureFixture, home: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--home", str(home), "--config", str(TINY_CONFIG), "store", "rebuild", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- recipes ------------------------------------------------------------------------------------
def test_every_build_records_its_recipe_with_the_section_values(built_demo: BuiltHome) -> None:
    clean = built_demo.clean[PARTITION]
    recipe = read_recipe(recipe_path(built_demo.home, clean.kind, clean.id))
    config = load_config(TINY_CONFIG)
    assert recipe == {
        "kind": "clean_documents",
        "id": clean.id,
        "partition": PARTITION,
        "code_version": "clean_documents-v3",
        "config_sha256": config.section_sha256("data"),
        "config_sections": {"data": config.data.model_dump(mode="json")},
        "inputs": [{"kind": "raw_documents", "id": built_demo.raw[PARTITION].id}],
        "recipe": {},
        "content_sha256": clean.content_sha256,
        "created_at": clean.manifest["created_at"],
        "git_commit": clean.manifest["git_commit"],
    }
    # section_values is exactly what section_sha256 hashes (ids did not change).
    from aieng_core.hashing import sha256_json

    assert config.section_sha256("data") == sha256_json(config.data.model_dump(mode="json"))
    assert config.section_sha256("model", "training") == sha256_json(config.section_values("model", "training"))
    kinds = sorted(p.name for p in (built_demo.home / RECIPES_DIR).iterdir())
    assert kinds == ["bpe_tokenizer", "clean_documents", "dataset_manifest", "raw_documents", "tokenized_documents"]


def test_gc_keeps_recipes_and_verify_does_not_flag_them(built_demo: BuiltHome, copy_home) -> None:
    home = copy_home(built_demo)
    recipes = sorted(p.relative_to(home) for p in (home / RECIPES_DIR).rglob("*.json"))
    tokenized = built_demo.tokenized[PARTITION]
    (home / "refs" / "tokenized_documents" / f"{PARTITION}.json").unlink()
    shutil.rmtree(home / "refs" / "dataset_manifest")

    result = collect_garbage(home, keep_newer_than=dt.timedelta(0))
    assert {(d["kind"], d["id"]) for d in result["deleted"]} == {
        ("tokenized_documents", tokenized.id),
        ("dataset_manifest", built_demo.dataset.id),
    }
    assert sorted(p.relative_to(home) for p in (home / RECIPES_DIR).rglob("*.json")) == recipes
    verified = verify_store(home)
    assert verified["ok"] is True
    assert verified["unexpected"] == [] and verified["staging"] == []


# ---- rebuilding what was deleted ----------------------------------------------------------------
def test_a_deleted_clean_artifact_is_rebuilt_with_the_same_id_and_content(built_demo: BuiltHome, copy_home) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    clean = built_demo.clean[PARTITION]
    refs = refs_of(home)
    shutil.rmtree(store.artifact_dir(clean.kind, clean.id))

    result = do_rebuild(store, clean.id)

    assert result == {
        "id": clean.id,
        "kind": "clean_documents",
        "rebuilt": [clean.id],
        "already_present": [built_demo.raw[PARTITION].id],
        "content_sha256": clean.content_sha256,
        "matches": True,
        "path": str(store.artifact_dir(clean.kind, clean.id)),
    }
    rebuilt = store.get(clean.kind, clean.id)
    assert store.verify(rebuilt) == []
    assert rebuilt.manifest["files"] == clean.manifest["files"]
    assert refs_of(home) == refs  # the real refs are never changed by a rebuild
    assert list((home / "work" / "rebuild").iterdir()) == []  # the scratch refs are gone
    # Present and intact now: a second rebuild does nothing.
    again = do_rebuild(store, clean.id)
    assert (again["rebuilt"], again["already_present"]) == ([], [clean.id])


def test_the_recorded_section_values_are_used_when_the_yaml_changed(
    built_demo: BuiltHome, copy_home, tmp_path: Path
) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    clean = built_demo.clean[PARTITION]
    shutil.rmtree(store.artifact_dir(clean.kind, clean.id))
    raw = yaml.safe_load(TINY_CONFIG.read_text(encoding="utf-8"))
    raw.setdefault("data", {})["min_chars"] = load_config(TINY_CONFIG).data.min_chars + 7
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(raw), encoding="utf-8")
    other = load_config(changed)
    assert other.section_sha256("data") != clean.manifest["config_sha256"]

    result = rebuild(store, clean.id, builders(), config_loader(str(changed)))
    assert (result["rebuilt"], result["content_sha256"]) == ([clean.id], clean.content_sha256)
    # Without recorded values, a current section that differs is refused, naming it.
    shutil.rmtree(store.artifact_dir(clean.kind, clean.id))
    path = recipe_path(home, clean.kind, clean.id)
    recipe = json.loads(path.read_bytes())
    path.write_text(json.dumps({**recipe, "config_sections": None}))
    with pytest.raises(RebuildRefused) as refused:
        rebuild(store, clean.id, builders(), lambda sections: other)
    assert str(refused.value) == (
        f"cannot rebuild clean_documents {clean.id}: no config values were recorded with it, and the current "
        f"data: config section(s) hash to {other.section_sha256('data')}, not the recipe's "
        f"{clean.manifest['config_sha256']}: set them back to the values it was built with"
    )


def test_a_tokenized_partition_and_its_clean_input_are_rebuilt_depth_first(built_demo: BuiltHome, copy_home) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    clean, tokenized = built_demo.clean[PARTITION], built_demo.tokenized[PARTITION]
    refs = refs_of(home)
    shutil.rmtree(store.artifact_dir(tokenized.kind, tokenized.id))
    shutil.rmtree(store.artifact_dir(clean.kind, clean.id))

    result = do_rebuild(store, tokenized.id)

    assert result["rebuilt"] == [clean.id, tokenized.id]
    assert result["already_present"] == [built_demo.raw[PARTITION].id, built_demo.tokenizer.id]
    assert result["content_sha256"] == tokenized.content_sha256
    assert store.get(clean.kind, clean.id).content_sha256 == clean.content_sha256
    assert refs_of(home) == refs
    assert verify_store(home)["ok"] is True


def test_a_damaged_dataset_manifest_is_moved_aside_and_rebuilt(built_demo: BuiltHome, copy_home) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    dataset = built_demo.dataset
    (store.artifact_dir(dataset.kind, dataset.id) / "train.bin").write_bytes(b"damaged")

    result = do_rebuild(store, dataset.id)

    assert (result["rebuilt"], result["content_sha256"]) == ([dataset.id], dataset.content_sha256)
    assert store.verify(store.get(dataset.kind, dataset.id)) == []
    set_aside = verify_store(home)["set_aside"]
    assert len(set_aside) == 1 and Path(set_aside[0]).name.startswith(f".damaged-{dataset.id}-")


# ---- what cannot be rebuilt ---------------------------------------------------------------------
def test_a_changed_landed_file_is_named(built_demo: BuiltHome, copy_home) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    raw, clean = built_demo.raw[PARTITION], built_demo.clean[PARTITION]
    shutil.rmtree(store.artifact_dir(raw.kind, raw.id))
    shutil.rmtree(store.artifact_dir(clean.kind, clean.id))
    landed = sorted(raw_partition_dir(home, PARTITION).iterdir())[0]
    recorded = next(s["sha256"] for s in raw.manifest["sources"] if s["name"] == landed.name)
    landed.write_bytes(landed.read_bytes() + b"\n")
    from aieng_core.hashing import sha256_file

    with pytest.raises(RebuildRefused) as refused:
        do_rebuild(store, clean.id)
    assert str(refused.value) == (
        f"cannot rebuild raw_documents {raw.id} (an input of clean_documents {clean.id}): landed file {landed} "
        f"has changed: its sha256 is {sha256_file(landed)}, the snapshot recorded {recorded}; a raw snapshot is "
        "only rebuilt from the bytes that landed: restore that file"
    )
    assert not store.artifact_dir(raw.kind, raw.id).exists()


def test_another_code_version_is_named_with_both_versions(built_demo: BuiltHome, copy_home) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    clean = built_demo.clean[PARTITION]
    shutil.rmtree(store.artifact_dir(clean.kind, clean.id))
    path = recipe_path(home, clean.kind, clean.id)
    recipe = json.loads(path.read_bytes())
    path.write_text(json.dumps({**recipe, "code_version": "clean_documents-v2", "git_commit": "abc123"}))

    with pytest.raises(RebuildRefused) as refused:
        do_rebuild(store, clean.id)
    assert str(refused.value) == (
        f"cannot rebuild clean_documents {clean.id}: code version clean_documents-v2 is no longer available: "
        "this checkout has clean_documents-v3; check out a commit with it (it was built at git commit abc123)"
    )


def test_a_build_that_is_not_reproducible_is_set_aside_and_named(built_demo: BuiltHome, copy_home) -> None:
    """A recipe whose content hash the build does not give back (here: recorded otherwise)."""
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    clean = built_demo.clean[PARTITION]
    shutil.rmtree(store.artifact_dir(clean.kind, clean.id))
    path = recipe_path(home, clean.kind, clean.id)
    path.write_text(json.dumps({**json.loads(path.read_bytes()), "content_sha256": "0" * 64}))
    recorded, refs = path.read_bytes(), refs_of(home)

    with pytest.raises(RebuildRefused) as refused:
        do_rebuild(store, clean.id)

    [aside] = verify_store(home)["set_aside"]
    assert Path(aside).name.startswith(f".damaged-{clean.id}-") and aside.endswith("-mismatch")
    assert str(refused.value) == (
        f"rebuilt clean_documents {clean.id}, but its content sha256 is {clean.content_sha256}, not the recipe's "
        f"{'0' * 64}: this build is not reproducible here (another thread count or device, another library "
        f"version?); the new copy was set aside as {aside}"
    )
    assert not store.artifact_dir(clean.kind, clean.id).exists()  # never under the id it does not match
    assert path.read_bytes() == recorded and refs_of(home) == refs
    # As it was after the deletion, plus the copy set aside: the ref still names the missing artifact.
    verified = verify_store(home)
    assert verified["damaged"] == []
    assert [(ref["kind"], ref["id"]) for ref in verified["bad_refs"]] == [("clean_documents", clean.id)]


def test_cli_exit_codes_and_one_line_errors(built_demo: BuiltHome, copy_home, capsys) -> None:
    home = copy_home(built_demo)
    store = ArtifactStore(home)
    clean = built_demo.clean[PARTITION]

    code, out, err = cli(capsys, home, "nosuchid")
    assert (code, out) == (1, "")
    assert err == (
        f"aieng: error: cannot rebuild artifact nosuchid: it is not in the store ({home / 'artifacts'}) and no "
        f"recipe for it is recorded under {home / RECIPES_DIR} (built before recipes were recorded, or never "
        "built here); restore it from a backup\n"
    )
    code, out, err = cli(capsys, home, clean.id)
    assert (code, err) == (0, "")
    assert out == (
        f"clean_documents {clean.id} is in the store and intact: nothing to rebuild "
        f"({store.artifact_dir(clean.kind, clean.id)})\n"
    )

    shutil.rmtree(store.artifact_dir(clean.kind, clean.id))
    code, out, err = cli(capsys, home, clean.id, "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["rebuilt"] == [clean.id]


def test_the_cli_starts_without_the_heavy_libraries() -> None:
    code = (
        "import sys\n"
        "from aieng_core import cli\n"
        "cli.build_parser().parse_args(['store', 'rebuild', 'x'])\n"
        "heavy = ('pydantic', 'numpy', 'pyarrow', 'torch')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


# ---- the model half -----------------------------------------------------------------------------
def test_a_deleted_rollback_target_bundle_is_rebuilt_and_rolled_back_to(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    from aieng_core.deploy.deployments import DeploymentError, Deployments
    from tests.core.gc_helpers import craft

    store = copy_bundled_home(serving_bundle_artifact)
    bundle = serving_bundle_artifact.bundle
    deployments = Deployments(store.home, store=store)
    deployments.promote(bundle.id, actor="tester", verify=False)
    newer = craft(store, bundle.kind, "newer")
    deployments.promote(newer.id, actor="tester", verify=False)
    refs = refs_of(store.home)
    shutil.rmtree(store.artifact_dir(bundle.kind, bundle.id))  # the rollback target, deleted by hand

    with pytest.raises(DeploymentError) as gone:
        deployments.rollback(actor="tester", verify=False)
    assert f"`aieng store rebuild {bundle.id}` rebuilds that exact bundle from its recorded recipe" in str(gone.value)

    result = do_rebuild(store, bundle.id)
    assert (result["rebuilt"], result["content_sha256"]) == ([bundle.id], bundle.content_sha256)
    assert result["already_present"] == [item["id"] for item in bundle.manifest["inputs"]]
    assert store.get(bundle.kind, bundle.id).manifest["files"] == bundle.manifest["files"]
    assert refs_of(store.home) == refs
    # The rebuilt bundle verifies as a rollback target: re-hashed, loaded, its goldens replayed.
    assert deployments.rollback(actor="tester", verify=True)["to"] == bundle.id


def test_a_deleted_model_is_retrained_to_the_same_bytes(trained_home: TrainedHome, tmp_path: Path) -> None:
    """Same dataset, config and thread count on one machine: training is bit-reproducible (CPU)."""
    home = tmp_path / "home"
    shutil.copytree(trained_home.home, home)
    store = ArtifactStore(home)
    model = trained_home.model
    store.set_current(store.get(model.kind, model.id))  # the fixture's model, whatever other tests made current
    refs = refs_of(home)
    shutil.rmtree(store.artifact_dir(model.kind, model.id))

    result = do_rebuild(store, model.id)

    assert (result["rebuilt"], result["content_sha256"]) == ([model.id], model.content_sha256)
    rebuilt = store.get(model.kind, model.id)
    assert rebuilt.file("model.safetensors").read_bytes() == model.file("model.safetensors").read_bytes()
    assert refs_of(home) == refs
