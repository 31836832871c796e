"""Recipes that outlive their artifacts: $AIENG_HOME/recipes/<kind>/<id>.json.

Every time ArtifactStore.build publishes an artifact (new or reused) it records what decided
the artifact's content: `{kind, id, partition, code_version, config_sha256, config_sections,
inputs, recipe, content_sha256, created_at, git_commit}`. `config_sections` holds the values
of the config sections the builder hashed, so `aieng store rebuild ID` (store/rebuild.py) can
rebuild exactly that artifact after the YAML changed, and check it has the same content.

Recipes are small and are what makes a deleted artifact rebuildable: `aieng store gc` never
touches recipes/ (it deletes under artifacts/ only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aieng_core.hashing import canonical_json
from aieng_core.store.atomic import atomic_write_bytes, is_temporary

RECIPES_DIR = "recipes"  # under $AIENG_HOME
RECIPE_KEYS = ("kind", "id", "code_version", "config_sha256", "inputs", "content_sha256")


class RecipeError(ValueError):
    """A recipe file that cannot be read or is not a recipe (a ValueError: one line, exit 1)."""


def recipe_path(home: Path, kind: str, artifact_id: str) -> Path:
    """The recipe file of `kind`/`artifact_id`; both must already be valid names (callers
    validate them as the store does, so the path stays under recipes/)."""
    return Path(home) / RECIPES_DIR / kind / f"{artifact_id}.json"


def record_recipe(home: Path, record: dict[str, Any]) -> Path:
    """Write `record` as the recipe of its artifact, unless the same bytes are there already.
    A record without config_sections never replaces one that has them (an old builder
    reusing an artifact a newer one recorded)."""
    path = recipe_path(home, record["kind"], record["id"])
    data = canonical_json(record)
    try:
        existing = path.read_bytes()
    except FileNotFoundError:
        existing = None
    if existing == data:
        return path
    if existing is not None and record.get("config_sections") is None:
        try:
            if json.loads(existing).get("config_sections") is not None:
                return path
        except (ValueError, AttributeError):
            pass  # a damaged recipe is replaced by the good one
    atomic_write_bytes(path, data)
    return path


def read_recipe(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise RecipeError(f"{path}: unreadable recipe: {exc}") from None
    missing = [key for key in RECIPE_KEYS if key not in doc] if isinstance(doc, dict) else list(RECIPE_KEYS)
    if missing:
        raise RecipeError(f"{path}: not a recipe (missing {', '.join(missing)})")
    if doc["id"] != path.stem or doc["kind"] != path.parent.name:
        raise RecipeError(f"{path}: names {doc['kind']} {doc['id']}, not {path.parent.name} {path.stem}")
    return doc


def find_recipe(home: Path, artifact_id: str) -> dict[str, Any] | None:
    """The recorded recipe of `artifact_id` (a valid name), whatever its kind; None if none."""
    root = Path(home) / RECIPES_DIR
    if not root.is_dir():
        return None
    for kind_dir in sorted(root.iterdir()):
        path = kind_dir / f"{artifact_id}.json"
        if not is_temporary(kind_dir.name) and path.is_file():
            return read_recipe(path)
    return None
