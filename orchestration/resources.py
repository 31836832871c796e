"""The one resource every asset uses: where state lives and which config to read.

`home` defaults to $AIENG_HOME, as the `aieng` CLI's does, so the UI, the Dagster CLI and
`aieng` see the same artifacts. `config_path` defaults to the file the code location loaded
(orchestration/partitions.py): one file decides the partitions and every setting. The file is
re-read at each use, so an edit to training settings needs no reload; an edit to
data.start_date does, and until then the resource refuses to run rather than disagree with
the partitions about which days exist.
"""

import dagster as dg

from aieng_core.config import AiengConfig, ConfigError, load_config
from aieng_core.home import resolve_home
from aieng_core.store import ArtifactStore
from orchestration.partitions import CONFIG_PATH, START_DATE


class AiengResource(dg.ConfigurableResource):
    home: str | None = None  # default: $AIENG_HOME, else ./.aieng
    config_path: str | None = None  # default: the code location's config ($AIENG_CONFIG when it loaded)

    def settings(self) -> AiengConfig:
        path = self.config_path or CONFIG_PATH
        config = load_config(path)
        if config.data.start_date != START_DATE:
            raise ConfigError(
                f"{path}: data.start_date is {config.data.start_date}, but the code location's daily partitions "
                f"start at {START_DATE} (data.start_date of {CONFIG_PATH}, read when it loaded); use one config "
                "file for both (AIENG_CONFIG and the resource's config_path), then reload the code location"
            )
        return config

    def store(self) -> ArtifactStore:
        return ArtifactStore(resolve_home(self.home))
