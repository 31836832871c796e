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
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from aieng_core.hashing import canonical_json, sha256_file, sha256_json
from aieng_core.store.atomic import atomic_directory, atomic_write_bytes, is_temporary

MANIFEST = "manifest.json"
UNPARTITIONED = "_unpartitioned"

log = logging.getLogger("aieng.store")


class ArtifactNotFound(LookupError):
    pass


class ArtifactIntegrityError(RuntimeError):
    """An artifact's files do not match its manifest."""


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


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The checkout's commit, if the code runs from one; recorded for lineage."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    if result.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=Path(__file__).resolve().parent,
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    ).stdout.strip()
    return f"{commit}-dirty" if dirty else commit


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class ArtifactStore:
    def __init__(self, home: str | os.PathLike) -> None:
        self.home = Path(home)
        self.root = self.home / "artifacts"
        self.refs = self.home / "refs"

    # ---- reading -------------------------------------------------------------------------
    def artifact_dir(self, kind: str, artifact_id: str) -> Path:
        if not artifact_id or "/" in artifact_id or artifact_id.startswith("."):
            raise ArtifactNotFound(f"invalid artifact id {artifact_id!r}")
        return self.root / kind / artifact_id

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
        if self.root.is_dir():
            for kind_dir in sorted(self.root.iterdir()):
                if (kind_dir / artifact_id / MANIFEST).is_file():
                    return self.get(kind_dir.name, artifact_id)
        raise ArtifactNotFound(f"no artifact with id {artifact_id!r} under {self.root}")

    def list_ids(self, kind: str) -> list[str]:
        kind_dir = self.root / kind
        if not kind_dir.is_dir():
            return []
        return sorted(p.name for p in kind_dir.iterdir() if not p.name.startswith(".") and (p / MANIFEST).is_file())

    def verify(self, artifact: Artifact) -> list[str]:
        """Re-hash every file against the manifest. Returns the problems, empty when intact."""
        problems = []
        listed = artifact.manifest.get("files", {})
        for relative, expected in sorted(listed.items()):
            path = artifact.path / relative
            if not path.is_file():
                problems.append(f"{path}: missing")
            elif sha256_file(path) != expected:
                problems.append(f"{path}: sha256 does not match the manifest")
        for path in sorted(artifact.path.rglob("*")):
            relative = path.relative_to(artifact.path).as_posix()
            if path.is_file() and relative != MANIFEST and relative not in listed:
                problems.append(f"{path}: not listed in the manifest")
        return problems

    def check(self, artifact: Artifact) -> Artifact:
        problems = self.verify(artifact)
        if problems:
            raise ArtifactIntegrityError(f"{artifact.kind} artifact {artifact.id} failed verification: " + "; ".join(problems))
        return artifact

    # ---- current pointers ---------------------------------------------------------------
    def _ref_path(self, kind: str, partition: str | None) -> Path:
        return self.refs / kind / f"{partition or UNPARTITIONED}.json"

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
        return self.get(kind, record["id"])

    def require_current(self, kind: str, partition: str | None = None) -> Artifact:
        artifact = self.current(kind, partition)
        if artifact is None:
            where = f"partition {partition}" if partition else "it"
            raise ArtifactNotFound(f"{kind} has not been materialized for {where} yet (no {self._ref_path(kind, partition)})")
        return artifact

    def current_partitions(self, kind: str) -> list[str]:
        kind_dir = self.refs / kind
        if not kind_dir.is_dir():
            return []
        return sorted(
            p.stem for p in kind_dir.glob("*.json") if p.stem != UNPARTITIONED and not is_temporary(p.name)
        )

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
            logger.warning(f"{spec.kind} artifact {artifact_id} is damaged ({'; '.join(problems)}); moved to {aside}, rebuilding")
            os.rename(target, aside)

        try:
            with atomic_directory(target) as staging:
                produced = produce(staging)
                files = {
                    path.relative_to(staging).as_posix(): sha256_file(path)
                    for path in sorted(staging.rglob("*"))
                    if path.is_file()
                }
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
                    "dagster_run_id": run.dagster_run_id,
                    "inputs": [{"kind": kind, "id": input_id} for kind, input_id in spec.inputs],
                    "content_sha256": produced.content_sha256,
                    "files": files,
                    "metrics": produced.metrics,
                    **produced.extra,
                }
                (staging / MANIFEST).write_bytes(json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8"))
        except FileExistsError:
            # A concurrent writer finished the same recipe first: its artifact is equivalent.
            existing = self.check(self.get(spec.kind, artifact_id))
            artifact = Artifact(spec.kind, artifact_id, target, existing.manifest, reused=True)
            self.set_current(artifact)
            return artifact
        artifact = Artifact(spec.kind, artifact_id, target, manifest, reused=False)
        self.set_current(artifact)
        return artifact
