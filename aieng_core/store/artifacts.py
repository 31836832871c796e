"""Immutable artifacts: $AIENG_HOME/artifacts/<asset_key>/<artifact_id>/ plus manifest.json.

An artifact's id is derived from its recipe: its kind, partition, code version, config
section and input ids (plus anything else that decides its content, such as raw file
hashes). Building the same recipe twice therefore finds the first artifact and reuses it,
after re-hashing its files against the manifest. The content hash of what was written
(`content_sha256`) is what Dagster records as the DataVersion.

"Current" pointers (refs/<asset_key>/<partition>.json) say which artifact each partition
of each asset is at now; downstream steps and the CLI read them.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aieng_core.faults import crash_point
from aieng_core.hashing import canonical_json, sha256_file, sha256_json
from aieng_core.store.atomic import TargetExists, atomic_directory, atomic_write_bytes
from aieng_core.store.provenance import git_commit, library_versions

MANIFEST = "manifest.json"
UNPARTITIONED = "_unpartitioned"

log = logging.getLogger("aieng.store")


class ArtifactNotFound(LookupError):
    pass


class InvalidArtifactName(ArtifactNotFound, ValueError):
    """A kind, artifact id or partition that may not be used as a path component."""


# Kinds, ids and partitions become path components, and ids come from ref files and
# manifests that anyone can edit by hand: only plain names, so none can leave the store.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def validate_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not is_valid_name(value):
        raise InvalidArtifactName(
            f"invalid {what} {value!r}: expected letters, digits, '.', '_' or '-' (no '..'), at most 128"
        )
    return value


def is_valid_name(value: str) -> bool:
    return bool(NAME_PATTERN.fullmatch(value)) and ".." not in value


def file_key_problem(key: Any) -> str | None:
    """Why a manifest `files` key is not a plain relative path inside the artifact, or None.

    Keys are checked as text before any path is built from them, so a hand-edited manifest
    cannot make verify() read (or hash) anything outside the artifact directory.
    """
    if not isinstance(key, str) or not key:
        return "is not a non-empty string"
    if "\x00" in key or "\\" in key:
        return "contains a NUL or a backslash"
    if key.startswith("/"):
        return "is an absolute path"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return "has an empty, '.' or '..' component"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def _listed_file_problem(root: Path, key: str) -> str | None:
    """Why the listed (well-formed) key is not a regular file reached without links, or None."""
    path = root
    for part in key.split("/"):
        path = path / part
        try:
            info = path.lstat()
        except FileNotFoundError:
            return "is missing"
        except OSError as exc:
            return f"cannot be examined ({exc.strerror})"
        if stat.S_ISLNK(info.st_mode):
            return "goes through a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    return None


def walk_tree(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative posix path, path, lstat) of every entry under root, never following a
    symbolic link (os.walk lists a linked directory but does not descend into it)."""
    for directory, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(directory) / name
            yield path.relative_to(root).as_posix(), path, path.lstat()


class ArtifactIntegrityError(RuntimeError):
    """An artifact's files do not match its manifest."""


class DamagedInput(ArtifactIntegrityError):
    """An upstream artifact a step is about to build from does not match its manifest."""


def rebuild_command(kind: str, partition: str | None) -> str:
    where = f" --partition {partition}" if partition else ""
    return f"dagster asset materialize -m orchestration.definitions --select {kind}{where}"


@dataclass(frozen=True)
class RunInfo:
    """Who is building: recorded in manifests, never part of an artifact's identity."""

    dagster_run_id: str | None = None


@dataclass(frozen=True)
class ArtifactSpec:
    """Everything that decides an artifact's content, and so its id."""

    kind: str
    code_version: str
    config_sha256: str
    partition: str | None = None
    inputs: tuple[tuple[str, str], ...] = ()  # (kind, id) pairs
    recipe: dict[str, Any] = field(default_factory=dict)  # anything else that decides content

    def recipe_sha256(self) -> str:
        return sha256_json(
            {
                "kind": self.kind,
                "partition": self.partition,
                "code_version": self.code_version,
                "config_sha256": self.config_sha256,
                "inputs": [list(pair) for pair in self.inputs],
                "recipe": self.recipe,
            }
        )

    def artifact_id(self) -> str:
        digest = self.recipe_sha256()[:16]
        return f"{self.partition}-{digest}" if self.partition else digest


@dataclass(frozen=True)
class Produced:
    """What a builder reports after writing its files into the staging directory."""

    content_sha256: str
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # extra manifest fields, e.g. sources


@dataclass(frozen=True)
class Artifact:
    kind: str
    id: str
    path: Path
    manifest: dict[str, Any]
    reused: bool = False

    @property
    def content_sha256(self) -> str:
        return self.manifest["content_sha256"]

    @property
    def metrics(self) -> dict[str, Any]:
        return self.manifest.get("metrics", {})

    def file(self, relative: str) -> Path:
        return self.path / relative

    def input_ids(self, kind: str) -> list[str]:
        return input_ids(self.manifest, kind)


def input_ids(manifest: dict[str, Any], kind: str) -> list[str]:
    """The ids of a manifest's inputs of `kind`, in manifest order."""
    return [item["id"] for item in manifest.get("inputs", []) if item.get("kind") == kind]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class ArtifactStore:
    def __init__(self, home: str | os.PathLike) -> None:
        self.home = Path(home)
        self.root = self.home / "artifacts"
        self.refs = self.home / "refs"

    # ---- reading -------------------------------------------------------------------------
    def artifact_dir(self, kind: str, artifact_id: str) -> Path:
        return self.root / validate_name(kind, "artifact kind") / validate_name(artifact_id, "artifact id")

    def get(self, kind: str, artifact_id: str) -> Artifact:
        path = self.artifact_dir(kind, artifact_id)
        manifest_path = path / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ArtifactNotFound(f"no {kind} artifact {artifact_id!r} under {self.root / kind}") from None
        except (OSError, ValueError) as exc:
            raise ArtifactIntegrityError(f"{manifest_path}: unreadable manifest: {exc}") from None
        return Artifact(kind=kind, id=artifact_id, path=path, manifest=manifest)

    def find(self, artifact_id: str) -> Artifact:
        """Look an artifact up by id alone, whatever its kind."""
        validate_name(artifact_id, "artifact id")
        if self.root.is_dir():
            for kind_dir in sorted(self.root.iterdir()):
                if is_valid_name(kind_dir.name) and (kind_dir / artifact_id / MANIFEST).is_file():
                    return self.get(kind_dir.name, artifact_id)
        raise ArtifactNotFound(f"no artifact with id {artifact_id!r} under {self.root}")

    def list_ids(self, kind: str) -> list[str]:
        kind_dir = self.root / validate_name(kind, "artifact kind")
        if not kind_dir.is_dir():
            return []
        # Moved-aside and in-progress directories start with "." and are not valid names.
        return sorted(p.name for p in kind_dir.iterdir() if is_valid_name(p.name) and (p / MANIFEST).is_file())

    def verify(self, artifact: Artifact) -> list[str]:
        """Re-hash every file against the manifest. Returns the problems, empty when intact.

        Only regular files inside the artifact directory are ever read: a listed name that
        could point elsewhere, and any symbolic link in the directory, is a problem itself.
        """
        root = artifact.path
        if root.is_symlink():
            return [f"{root}: the artifact directory is a symbolic link"]
        listed = artifact.manifest.get("files", {})
        if not isinstance(listed, dict):
            return [f"{root}: manifest 'files' is not a mapping"]
        problems = []
        for key, expected in sorted(listed.items()):
            why = file_key_problem(key)
            if why is None:
                why = _listed_file_problem(root, key)
            if why is not None:
                problems.append(f"{root}: manifest lists {key!r}, which {why}; not read")
            elif sha256_file(root / key) != expected:
                problems.append(f"{root / key}: sha256 does not match the manifest")
        for relative, path, info in walk_tree(root):
            if stat.S_ISLNK(info.st_mode):
                problems.append(f"{path}: a symbolic link inside the artifact")
            elif not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                problems.append(f"{path}: neither a regular file nor a directory")
            elif stat.S_ISREG(info.st_mode) and relative != MANIFEST and relative not in listed:
                problems.append(f"{path}: not listed in the manifest")
        return problems

    def check(self, artifact: Artifact) -> Artifact:
        problems = self.verify(artifact)
        if problems:
            raise ArtifactIntegrityError(
                f"{artifact.kind} artifact {artifact.id} failed verification: " + "; ".join(problems)
            )
        return artifact

    def check_input(self, artifact: Artifact) -> Artifact:
        """Re-hash an upstream artifact before building from it. A damaged input would give
        a wrong artifact under the right recipe id, reused forever; instead the step stops,
        naming the file and how to rebuild the input (the same recipe is rebuilt, the
        damaged copy moved aside)."""
        problems = self.verify(artifact)
        if problems:
            partition = artifact.manifest.get("partition")
            raise DamagedInput(
                f"input {artifact.kind} artifact {artifact.id} is damaged ({'; '.join(problems[:3])}"
                f"{'; ...' if len(problems) > 3 else ''}); rebuild it with "
                f"`{rebuild_command(artifact.kind, partition)}`, then retry"
            )
        return artifact

    # ---- current pointers ---------------------------------------------------------------
    def _ref_path(self, kind: str, partition: str | None) -> Path:
        name = UNPARTITIONED if partition is None else validate_name(partition, "partition")
        return self.refs / validate_name(kind, "artifact kind") / f"{name}.json"

    def set_current(self, artifact: Artifact) -> None:
        partition = artifact.manifest.get("partition")
        record = {"kind": artifact.kind, "id": artifact.id, "partition": partition, "updated_at": _now()}
        atomic_write_bytes(self._ref_path(artifact.kind, partition), canonical_json(record))

    def current(self, kind: str, partition: str | None = None) -> Artifact | None:
        ref = self._ref_path(kind, partition)
        try:
            record = json.loads(ref.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ArtifactIntegrityError(f"{ref}: unreadable ref: {exc}") from None
        # get() validates whatever the id is (a non-string too): a hand-edited ref must not
        # point outside the store, and the error names the bad value.
        artifact_id: Any = record.get("id") if isinstance(record, dict) else None
        return self.get(kind, artifact_id)

    def require_current(self, kind: str, partition: str | None = None) -> Artifact:
        artifact = self.current(kind, partition)
        if artifact is None:
            where = f"partition {partition}" if partition else "it"
            raise ArtifactNotFound(
                f"{kind} has not been materialized for {where} yet (no {self._ref_path(kind, partition)})"
            )
        return artifact

    def current_partitions(self, kind: str) -> list[str]:
        kind_dir = self.refs / validate_name(kind, "artifact kind")
        if not kind_dir.is_dir():
            return []
        # Temporary ref files and the unpartitioned ref start with "." or "_": not partitions.
        return sorted(p.stem for p in kind_dir.glob("*.json") if is_valid_name(p.stem))

    # ---- writing -------------------------------------------------------------------------
    def build(
        self,
        spec: ArtifactSpec,
        produce: Callable[[Path], Produced],
        run: RunInfo = RunInfo(),
        logger: logging.Logger | Any = log,
    ) -> Artifact:
        """Reuse the artifact for `spec` if an intact one exists, else produce it atomically.

        The new artifact also becomes the current one for its asset and partition.
        """
        artifact_id = spec.artifact_id()
        target = self.artifact_dir(spec.kind, artifact_id)
        if target.exists():
            try:
                existing = self.get(spec.kind, artifact_id)
                problems = self.verify(existing)
            except (ArtifactNotFound, ArtifactIntegrityError) as exc:
                problems = [str(exc)]
            if not problems:
                artifact = Artifact(spec.kind, artifact_id, target, existing.manifest, reused=True)
                self.set_current(artifact)
                return artifact
            # Keep the damaged copy for inspection instead of deleting anything.
            aside = target.parent / f".damaged-{artifact_id}-{dt.datetime.now().strftime('%Y%m%dT%H%M%S%f')}"
            logger.warning(
                f"{spec.kind} artifact {artifact_id} is damaged ({'; '.join(problems)}); moved to {aside}, rebuilding"
            )
            os.rename(target, aside)

        try:
            with atomic_directory(target) as staging:
                produced = produce(staging)
                files = {}
                for relative, path, info in walk_tree(staging):
                    if stat.S_ISDIR(info.st_mode):
                        continue
                    # Anything verify() would reject later must fail now, not on every reuse.
                    why = file_key_problem(relative) or (
                        None if stat.S_ISREG(info.st_mode) else "is not a regular file"
                    )
                    if why is not None:
                        raise RuntimeError(f"{spec.kind} builder wrote {relative!r}, which {why}")
                    files[relative] = sha256_file(path)
                if MANIFEST in files:
                    raise RuntimeError(f"{spec.kind} builder must not write {MANIFEST} itself")
                manifest = {
                    "kind": spec.kind,
                    "id": artifact_id,
                    "partition": spec.partition,
                    "created_at": _now(),
                    "code_version": spec.code_version,
                    "config_sha256": spec.config_sha256,
                    "recipe_sha256": spec.recipe_sha256(),
                    "git_commit": git_commit(),
                    "libraries": library_versions(),
                    "dagster_run_id": run.dagster_run_id,
                    "inputs": [{"kind": kind, "id": input_id} for kind, input_id in spec.inputs],
                    "content_sha256": produced.content_sha256,
                    "files": files,
                    "metrics": produced.metrics,
                    **produced.extra,
                }
                (staging / MANIFEST).write_bytes(json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8"))
                crash_point(f"artifact.staged:{spec.kind}")
        except TargetExists as exc:
            if exc.target != target:  # the builder's own atomic write (a checkpoint, say) lost a race
                raise
            # A concurrent writer finished the same recipe first: its artifact is equivalent.
            existing = self.check(self.get(spec.kind, artifact_id))
            artifact = Artifact(spec.kind, artifact_id, target, existing.manifest, reused=True)
            self.set_current(artifact)
            return artifact
        artifact = Artifact(spec.kind, artifact_id, target, manifest, reused=False)
        crash_point(f"artifact.published:{spec.kind}")
        self.set_current(artifact)
        return artifact
