"""`aieng store rebuild ID`: build that exact artifact again from its recorded recipe.

The recipe is recipes/<kind>/<id>.json (store/recipes.py; for an artifact still in the store
but damaged, its manifest will do). A rebuild
1. stops at once when the artifact is in the store and intact (nothing to do);
2. refuses when this checkout's code version of the kind is not the recipe's;
3. makes sure every input is present and intact, rebuilding a missing or damaged one first
   from its own recipe (depth first, the same checks), or refuses naming the input and why;
4. builds the config: the current one with the recipe's section values put back, whose hash
   must be the recipe's config_sha256 (no values recorded: the current sections must hash so);
5. runs the kind's builder against a scratch view of the store: artifacts/ is the real one (the
   result lands in the store), refs/ a temporary directory holding refs for exactly the
   recipe's inputs and what they were built from, so the builder reads those and nothing
   current; the real refs are never changed by a rebuild;
6. checks the result has the requested id and the recipe's content hash. Another content under
   the same id is not the artifact that was lost: it is set aside (`.damaged-<id>-<time>-mismatch`,
   listed by `aieng store verify`, never read as an artifact) and the rebuild fails, saying the
   build is not reproducible (a model trained on another thread count, a benchmark's timings).

The builders are the CLI's to supply (this layer imports none of them): `Builder` per kind.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aieng_core.store.artifacts import (
    MANIFEST,
    Artifact,
    ArtifactIntegrityError,
    ArtifactNotFound,
    ArtifactStore,
    validate_name,
)
from aieng_core.store.atomic import atomic_write_bytes
from aieng_core.store.recipes import RECIPES_DIR, find_recipe, read_recipe, recipe_path
from aieng_core.store.verify import SET_ASIDE_PREFIX  # what `aieng store verify` lists as set aside

log = logging.getLogger("aieng.store")


class RebuildRefused(ValueError):
    """The artifact cannot be rebuilt, or was rebuilt but is not the same (one line, exit 1)."""


@dataclass(frozen=True)
class Builder:
    """How one kind is rebuilt, supplied by the CLI (which may import the builders)."""

    code_version: str  # the builder module's CODE_VERSION in this checkout
    sections: tuple[str, ...]  # the config sections its config_sha256 covers, named in errors
    config_sha256: Callable[[Any], str]  # its config_sha256 of a config
    build: Callable[[ArtifactStore, Any, dict[str, Any]], Artifact]  # (store, config, recipe)
    # Refuses (RebuildRefused) what it can tell will not give the recipe's artifact: landed
    # files that changed since the snapshot, say.
    check: Callable[[ArtifactStore, dict[str, Any]], None] | None = None


ConfigFor = Callable[[dict[str, Any] | None], Any]  # recorded section values -> the config to build with


def rebuild(
    store: ArtifactStore, artifact_id: str, builders: dict[str, Builder], config_for: ConfigFor
) -> dict[str, Any]:
    """Rebuild `artifact_id` (and what it needs) so that it is present and intact. `{id, kind,
    rebuilt: [ids in build order], already_present: [ids], content_sha256, matches, path}`;
    RebuildRefused naming the input, code version, config section or content that stops it."""
    validate_name(artifact_id, "artifact id")
    done: dict[str, list[str]] = {"rebuilt": [], "already_present": []}
    artifact = _ensure(store, None, artifact_id, None, builders, config_for, done, ())
    return {
        "id": artifact.id,
        "kind": artifact.kind,
        "rebuilt": done["rebuilt"],
        "already_present": done["already_present"],
        "content_sha256": artifact.content_sha256,
        "matches": True,
        "path": str(artifact.path),
    }


def _ensure(
    store: ArtifactStore,
    kind: str | None,
    artifact_id: str,
    needed_by: str | None,
    builders: dict[str, Builder],
    config_for: ConfigFor,
    done: dict[str, list[str]],
    chain: tuple[str, ...],
) -> Artifact:
    what = f"{kind or 'artifact'} {artifact_id}" + (f" (an input of {needed_by})" if needed_by else "")
    if artifact_id in chain:
        raise RebuildRefused(f"cannot rebuild {what}: its recipe needs itself ({' -> '.join((*chain, artifact_id))})")
    recipe = _recipe(store, kind, artifact_id)
    kind = kind or (recipe["kind"] if recipe else None)
    intact = _intact(store, kind, artifact_id)
    if intact is not None:
        done["already_present"].append(artifact_id)
        return intact
    if recipe is None:
        raise RebuildRefused(
            f"cannot rebuild {what}: it is not in the store ({store.root}) and no recipe for it is recorded "
            f"under {store.home / RECIPES_DIR} (built before recipes were recorded, or never built here); "
            "restore it from a backup"
        )
    kind = recipe["kind"]
    what = f"{kind} {artifact_id}" + (f" (an input of {needed_by})" if needed_by else "")
    builder = builders.get(kind)
    if builder is None:
        raise RebuildRefused(f"cannot rebuild {what}: no builder for kind {kind!r} in this checkout")
    if builder.code_version != recipe["code_version"]:
        commit = recipe.get("git_commit")
        raise RebuildRefused(
            f"cannot rebuild {what}: code version {recipe['code_version']} is no longer available: this checkout "
            f"has {builder.code_version}; check out a commit with it"
            + (f" (it was built at git commit {commit})" if commit else "")
        )
    inputs = [(item["kind"], item["id"]) for item in recipe["inputs"]]
    for input_kind, input_id in inputs:
        _ensure(store, input_kind, input_id, f"{kind} {artifact_id}", builders, config_for, done, (*chain, artifact_id))
    if builder.check is not None:
        try:
            builder.check(store, recipe)
        except RebuildRefused as exc:
            raise RebuildRefused(f"cannot rebuild {what}: {exc}") from None
    config = _config(builder, recipe, config_for, what)
    recorded = recipe_path(store.home, kind, artifact_id)
    recorded_bytes = recorded.read_bytes() if recorded.is_file() else None
    built = _build_in_scratch(store, builder, config, recipe, inputs)
    if built.id != artifact_id:
        raise RebuildRefused(
            f"cannot rebuild {what}: the recipe gave id {built.id}, not {artifact_id} (something it reads is "
            f"no longer what it was); {built.id} is in the store, named by no ref"
        )
    if built.content_sha256 != recipe["content_sha256"]:
        aside = _set_aside(store, built, recorded_bytes)
        raise RebuildRefused(
            f"rebuilt {what}, but its content sha256 is {built.content_sha256}, not the recipe's "
            f"{recipe['content_sha256']}: this build is not reproducible here (another thread count or device, "
            f"another library version?); the new copy was set aside as {aside}"
        )
    done["rebuilt"].append(artifact_id)
    return built


def _recipe(store: ArtifactStore, kind: str | None, artifact_id: str) -> dict[str, Any] | None:
    """The recorded recipe, else (an artifact still in the store, damaged) its manifest's."""
    if kind is not None:
        path = recipe_path(store.home, validate_name(kind, "artifact kind"), artifact_id)
        recorded = read_recipe(path) if path.is_file() else None
    else:
        recorded = find_recipe(store.home, artifact_id)
    if recorded is not None:
        return recorded
    try:
        manifest = store.get(kind, artifact_id).manifest if kind else store.find(artifact_id).manifest
    except (ArtifactNotFound, ArtifactIntegrityError):
        return None
    keys = ("kind", "id", "partition", "code_version", "config_sha256", "inputs", "content_sha256", "git_commit")
    if not isinstance(manifest, dict) or any(key not in manifest for key in keys[:-1]):
        return None
    return {**{key: manifest.get(key) for key in keys}, "config_sections": None, "recipe": None}


def _intact(store: ArtifactStore, kind: str | None, artifact_id: str) -> Artifact | None:
    if kind is None:
        return None
    try:
        artifact = store.get(kind, artifact_id)
    except (ArtifactNotFound, ArtifactIntegrityError):
        return None
    if not isinstance(artifact.manifest, dict) or artifact.manifest.get("id") != artifact_id:
        return None
    return None if store.verify(artifact) else artifact


def _config(builder: Builder, recipe: dict[str, Any], config_for: ConfigFor, what: str) -> Any:
    recorded = recipe.get("config_sections")
    named = ", ".join(f"{name}:" for name in builder.sections) or "no"
    try:
        config = config_for(recorded)
    except ValueError as exc:
        raise RebuildRefused(
            f"cannot rebuild {what}: its recorded {named} config sections are not valid now: {exc}"
        ) from None
    found = builder.config_sha256(config)
    if found == recipe["config_sha256"]:
        return config
    if recorded is None:
        raise RebuildRefused(
            f"cannot rebuild {what}: no config values were recorded with it, and the current {named} config "
            f"section(s) hash to {found}, not the recipe's {recipe['config_sha256']}: set them back to the values "
            "it was built with"
        )
    raise RebuildRefused(
        f"cannot rebuild {what}: its recorded {named} config section values now hash to {found}, not the "
        f"recipe's {recipe['config_sha256']} (the sections' schema changed: a key added, or a default changed)"
    )


def _build_in_scratch(
    store: ArtifactStore, builder: Builder, config: Any, recipe: dict[str, Any], inputs: list[tuple[str, str]]
) -> Artifact:
    """Run the builder with refs naming the recipe's inputs (and, beneath them, what they were
    built from: a dataset manifest checks each tokenized partition against its clean one)."""
    work = store.home / "work" / "rebuild"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="refs-") as refs:
        scratch = ArtifactStore(store.home)
        scratch.refs = Path(refs)
        beneath: list[Artifact] = []
        pending = [store.get(kind, input_id) for kind, input_id in inputs]
        seen: set[tuple[str, str]] = set()
        while pending:
            artifact = pending.pop()
            if (artifact.kind, artifact.id) in seen:
                continue
            seen.add((artifact.kind, artifact.id))
            beneath.append(artifact)
            for item in artifact.manifest.get("inputs", []):
                if (store.artifact_dir(item["kind"], item["id"]) / MANIFEST).is_file():
                    pending.append(store.get(item["kind"], item["id"]))
        # The recipe's own inputs last: where two name one ref, the input wins.
        direct = set(inputs)
        for artifact in [a for a in beneath if (a.kind, a.id) not in direct] + [store.get(k, i) for k, i in inputs]:
            scratch.set_current(artifact)
        return builder.build(scratch, config, recipe)


def _set_aside(store: ArtifactStore, built: Artifact, recorded: bytes | None) -> Path:
    """Move the rebuilt artifact whose content is not the recipe's out of its id, and put back
    the recipe file as it was (the build recorded the new content hash in it)."""
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S%f")
    aside = built.path.parent / f"{SET_ASIDE_PREFIX}{built.id}-{stamp}-mismatch"
    with store.writing():
        os.rename(built.path, aside)
    path = recipe_path(store.home, built.kind, built.id)
    if recorded is not None:
        atomic_write_bytes(path, recorded)
    else:
        path.unlink(missing_ok=True)
    return aside


def format_rebuild(result: dict[str, Any]) -> str:
    if not result["rebuilt"]:
        return f"{result['kind']} {result['id']} is in the store and intact: nothing to rebuild ({result['path']})"
    present = ", ".join(result["already_present"]) or "none"
    return (
        f"rebuilt {result['kind']} {result['id']}: content sha256 {result['content_sha256']} matches its recipe "
        f"({result['path']}); rebuilt in order: {', '.join(result['rebuilt'])}; inputs already present: {present}"
    )
