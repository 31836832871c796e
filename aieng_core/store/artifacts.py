"""Immutable artifacts: $AIENG_HOME/artifacts/<asset_key>/<artifact_id>/ plus manifest.json.

An artifact's id is derived from its recipe: its kind, partition, code version, config
section and input ids (plus anything else that decides its content, such as raw file
hashes). Building the same recipe twice therefore finds the first artifact and reuses it,
after re-hashing its files against the manifest. The content hash of what was written
(`content_sha256`) is what Dagster records as the DataVersion.

"Current" pointers (refs/<asset_key>/<partition>.json) say which artifact each partition
of each asset is at now; downstream steps and the CLI read them.

`aieng store gc` (store/gc.py) deletes what nothing reaches; two locks keep it off what a
writer is using. A build holds each of its inputs (`hold`: a shared flock on its
manifest.json, which gc never takes from anyone) for the whole build, and takes the store's
gc lock shared (`writing`) around the moments an artifact is reachable from no ref yet: the
reuse check until its ref is set, and the rename that publishes a new one until its ref is set.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aieng_core.faults import crash_point
from aieng_core.hashing import canonical_json, sha256_file, sha256_json
from aieng_core.store.artifact_paths import (  # noqa: F401  (re-exported: the store's names)
    NAME_PATTERN,
    ArtifactNotFound,
    InvalidArtifactName,
    file_key_problem,
    is_valid_name,
    listed_file_problem,
    validate_name,
    walk_tree,
)
from aieng_core.store.atomic import TargetExists, atomic_directory, atomic_write_bytes
from aieng_core.store.file_lock import held_file, shared_lock
from aieng_core.store.provenance import git_commit, library_versions
from aieng_core.store.recipes import record_recipe

MANIFEST = "manifest.json"
UNPARTITIONED = "_unpartitioned"
GC_LOCK = ("work", "locks", "store-gc.lock")  # under $AIENG_HOME: gc exclusive, writers shared

log = logging.getLogger("aieng.store")


class ArtifactIntegrityError(RuntimeError):
    """An artifact's files do not match its manifest."""


class DamagedInput(ArtifactIntegrityError):
    """An upstream artifact a step is about to build from does not match its manifest."""


def rebuild_command(kind: str, partition: str | None, artifact_id: str | None = None) -> str:
    """How to get an artifact built. With `artifact_id`: `aieng store rebuild ID`, which rebuilds
    that very artifact from its recorded recipe, then the Dagster command as the alternative (it
    makes a new current artifact from the current inputs and config, which may be another id)."""
    where = f" --partition {partition}" if partition else ""
    materialize = f"dagster asset materialize -m orchestration.definitions --select {kind}{where}"
    if artifact_id is None:
        return materialize
    return f"aieng store rebuild {artifact_id}` (that exact artifact, from its recipe), or `{materialize}"


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
    # The values of the config sections config_sha256 hashes ({section: values}), recorded in the
    # recipe file so a rebuild can use them; not part of the id (config_sha256 already is).
    config_sections: dict[str, Any] | None = field(default=None, compare=False)

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
        self.gc_lock = self.home.joinpath(*GC_LOCK)

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
                why = listed_file_problem(root, key)
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
                f"`{rebuild_command(artifact.kind, partition, artifact.id)}`, then retry"
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

    def restore_current(self, kind: str, previous: Artifact | None) -> None:
        """Point `kind`'s unpartitioned ref back at `previous` (what current() said before a
        build that failed half way), or remove it when there was none. No artifact is deleted."""
        if previous is not None:
            self.set_current(previous)
        else:
            self._ref_path(kind, None).unlink(missing_ok=True)

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

    # ---- in use: what `aieng store gc` must leave alone ---------------------------------------
    @contextmanager
    def hold(self, artifact: Artifact) -> Iterator[Artifact]:
        """Keep `aieng store gc` off `artifact` for the block (a build's inputs, the bundle a
        server serves, a bundle being promoted). ArtifactNotFound when it is not (any longer)
        in the store."""
        held = ExitStack()
        try:
            held.enter_context(held_file(artifact.path / MANIFEST))
        except FileNotFoundError:
            raise ArtifactNotFound(
                f"{artifact.kind} artifact {artifact.id} is not in the store (no {artifact.path / MANIFEST})"
            ) from None
        with held:
            yield artifact

    @contextmanager
    def writing(self) -> Iterator[None]:
        """The gc lock, shared: held while an artifact is in the store but no ref names it yet."""
        with shared_lock(self.gc_lock, on_wait=lambda: log.info(f"waiting for `aieng store gc` ({self.gc_lock})")):
            yield

    # ---- writing -------------------------------------------------------------------------
    def build(
        self,
        spec: ArtifactSpec,
        produce: Callable[[Path], Produced],
        run: RunInfo = RunInfo(),
        logger: logging.Logger | Any = log,
    ) -> Artifact:
        """Reuse the artifact for `spec` if an intact one exists, else produce it atomically.

        The new artifact also becomes the current one for its asset and partition. Its inputs
        are held (`hold`) for the whole build.
        """
        with ExitStack() as holds:
            for kind, input_id in spec.inputs:
                path = self.artifact_dir(kind, input_id)
                # One not in the store (a made-up id; one gc took before this build began) cannot
                # be held: the builder finds it missing when it reads it.
                if (path / MANIFEST).is_file():
                    holds.enter_context(self.hold(Artifact(kind, input_id, path, {})))
            return self._build(spec, produce, run, logger)

    def _build(
        self, spec: ArtifactSpec, produce: Callable[[Path], Produced], run: RunInfo, logger: logging.Logger | Any
    ) -> Artifact:
        artifact_id = spec.artifact_id()
        target = self.artifact_dir(spec.kind, artifact_id)
        with self.writing():  # from the reuse check until its ref is set: never only in gc's view
            reused = self._reuse(spec, artifact_id, target, logger)
        if reused is not None:
            self._record_recipe(spec, reused)
            return reused
        publishing = ExitStack()  # the gc lock, from the rename until the ref is set
        try:
            with publishing:
                with atomic_directory(target) as staging:
                    manifest = self._produce(spec, artifact_id, staging, produce, run)
                    crash_point(f"artifact.staged:{spec.kind}")
                    publishing.enter_context(self.writing())
                artifact = Artifact(spec.kind, artifact_id, target, manifest, reused=False)
                crash_point(f"artifact.published:{spec.kind}")
                self.set_current(artifact)
            self._record_recipe(spec, artifact)
            return artifact
        except TargetExists as exc:
            if exc.target != target:  # the builder's own atomic write (a checkpoint, say) lost a race
                raise
            # A concurrent writer finished the same recipe first: its artifact is equivalent.
            with self.writing():
                existing = self.check(self.get(spec.kind, artifact_id))
                artifact = Artifact(spec.kind, artifact_id, target, existing.manifest, reused=True)
                self.set_current(artifact)
            self._record_recipe(spec, artifact)
            return artifact

    def _record_recipe(self, spec: ArtifactSpec, artifact: Artifact) -> None:
        """Keep what decided `artifact` beyond the artifact itself (store/recipes.py)."""
        manifest = artifact.manifest
        record_recipe(
            self.home,
            {
                "kind": spec.kind,
                "id": artifact.id,
                "partition": spec.partition,
                "code_version": spec.code_version,
                "config_sha256": spec.config_sha256,
                "config_sections": spec.config_sections,
                "inputs": [{"kind": kind, "id": input_id} for kind, input_id in spec.inputs],
                "recipe": spec.recipe,
                "content_sha256": manifest.get("content_sha256"),
                "created_at": manifest.get("created_at"),
                "git_commit": manifest.get("git_commit"),
            },
        )

    def _reuse(
        self, spec: ArtifactSpec, artifact_id: str, target: Path, logger: logging.Logger | Any
    ) -> Artifact | None:
        """The intact artifact already at `target`, made current; None when there is none (a
        damaged one is moved aside)."""
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
        return None

    def _produce(
        self, spec: ArtifactSpec, artifact_id: str, staging: Path, produce: Callable[[Path], Produced], run: RunInfo
    ) -> dict[str, Any]:
        """Run the builder in `staging`, then write the manifest of what it wrote."""
        produced = produce(staging)
        files = {}
        for relative, path, info in walk_tree(staging):
            if stat.S_ISDIR(info.st_mode):
                continue
            # Anything verify() would reject later must fail now, not on every reuse.
            why = file_key_problem(relative) or (None if stat.S_ISREG(info.st_mode) else "is not a regular file")
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
        return manifest
