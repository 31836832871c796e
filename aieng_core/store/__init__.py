"""The artifact store: immutable, content-checked artifact directories under $AIENG_HOME."""

from aieng_core.store.artifacts import (
    Artifact,
    ArtifactIntegrityError,
    ArtifactNotFound,
    ArtifactSpec,
    ArtifactStore,
    DamagedInput,
    InvalidArtifactName,
    Produced,
    RunInfo,
)

__all__ = [
    "Artifact",
    "ArtifactIntegrityError",
    "ArtifactNotFound",
    "ArtifactSpec",
    "ArtifactStore",
    "DamagedInput",
    "InvalidArtifactName",
    "Produced",
    "RunInfo",
]
