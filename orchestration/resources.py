"""The one resource every asset uses: where state lives and which config to read.

Both default to the same environment variables the `aieng` CLI reads (AIENG_HOME,
AIENG_CONFIG), so the UI, the Dagster CLI and `aieng` always see the same artifacts.
"""

import dagster as dg

from aieng_core.config import AiengConfig, load_config
from aieng_core.home import resolve_home
from aieng_core.store import ArtifactStore


class AiengResource(dg.ConfigurableResource):
    home: str | None = None  # default: $AIENG_HOME, else ./.aieng
    config_path: str | None = None  # default: $AIENG_CONFIG, else configs/pipeline.yaml

    def settings(self) -> AiengConfig:
        return load_config(self.config_path)

    def store(self) -> ArtifactStore:
        return ArtifactStore(resolve_home(self.home))
