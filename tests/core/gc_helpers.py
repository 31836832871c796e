"""A store for the `aieng store gc` tests: crafted artifacts (cheap: gc and `store verify` read
only manifests and file hashes), three bundles deployed on production, a pin, one current ref,
and four artifacts that nothing reaches.

    model  <- x, y, z          bundles promoted in that order: z current, stack [x, y]
    old_model <- old_bundle    an old bundle and its model: nothing reaches them
    raw_old <- clean_old       partition 2025-12-31 before a re-landing: garbage
    raw_new                    partition 2025-12-31 now: the current ref
    raw_pin <- clean_pin       pinned (clean_pin): both kept
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from aieng_core.deploy.deployments import Deployments
from aieng_core.hashing import sha256_bytes
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced
from aieng_core.store.pins import pin

BUNDLE = "serving_bundle"


def craft(
    store: ArtifactStore, kind: str, name: str, inputs: tuple[Artifact, ...] = (), partition: str | None = None
) -> Artifact:
    """An artifact of `kind` with three files (one nested) and these inputs."""

    def produce(staging: Path) -> Produced:
        (staging / "data.bin").write_bytes(f"{kind} {name}\n".encode() * (64 + len(name)))
        (staging / "sub").mkdir()
        (staging / "sub" / "more.txt").write_text(f"nested {name}\n")
        return Produced(content_sha256=sha256_bytes(name.encode()))

    spec = ArtifactSpec(
        kind=kind,
        code_version=f"{kind}-v1",
        config_sha256="c" * 64,
        partition=partition,
        inputs=tuple((item.kind, item.id) for item in inputs),
        recipe={"name": name},
    )
    return store.build(spec, produce)


def dir_bytes(path: Path) -> int:
    """The bytes of every regular file under `path`, counted independently of gc."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            info = os.lstat(Path(directory) / name)
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


@dataclass(frozen=True)
class GcHome:
    home: Path
    store: ArtifactStore
    a: dict[str, Artifact]  # by name, as in the module docstring

    def key(self, name: str) -> tuple[str, str]:
        return (self.a[name].kind, self.a[name].id)

    def keys(self, *names: str) -> list[tuple[str, str]]:
        return sorted(self.key(name) for name in names)


GARBAGE = ("old_bundle", "old_model", "raw_old", "clean_old")
KEPT = ("model", "x", "y", "z", "raw_new", "raw_pin", "clean_pin")


def make_gc_home(home: Path) -> GcHome:
    store = ArtifactStore(home)
    a: dict[str, Artifact] = {}
    a["model"] = craft(store, "model_checkpoint", "model")
    for name in ("x", "y", "z"):
        a[name] = craft(store, BUNDLE, name, (a["model"],))
    a["old_model"] = craft(store, "model_checkpoint", "old_model")
    a["old_bundle"] = craft(store, BUNDLE, "old_bundle", (a["old_model"],))
    a["raw_old"] = craft(store, "raw_documents", "raw_old", partition="2025-12-31")
    a["clean_old"] = craft(store, "clean_documents", "clean_old", (a["raw_old"],), partition="2025-12-31")
    a["raw_new"] = craft(store, "raw_documents", "raw_new", partition="2025-12-31")
    a["raw_pin"] = craft(store, "raw_documents", "raw_pin", partition="2025-12-30")
    a["clean_pin"] = craft(store, "clean_documents", "clean_pin", (a["raw_pin"],), partition="2025-12-30")
    # Every build made its artifact current: only raw_new stays current, as after a re-landing.
    shutil.rmtree(store.refs)
    store.set_current(a["raw_new"])
    for name in ("x", "y", "z"):
        Deployments(home).promote(a[name].id, actor="tester", verify=False)
    pin(store, a["clean_pin"].id, "the audit of 2025-12-30", "tester")
    return GcHome(home, store, a)
