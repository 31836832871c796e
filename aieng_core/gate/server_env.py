"""The environment of the `aieng serve` processes a gate starts: the gate's own home, and its
own config written to a file, so the server runs with exactly the settings the gate was given
(a config changed in memory included), never with whatever $AIENG_CONFIG names."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from aieng_core.config import AiengConfig
from aieng_core.store.atomic import atomic_write_bytes

# Never passed on: the gate's servers keep their admin API disabled.
WITHHELD = ("AIENG_ADMIN_TOKEN",)


def write_config(config: AiengConfig, path: Path) -> Path:
    """`config` as YAML that load_config reads back to an equal config."""
    text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


def server_env(home: Path, config_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in WITHHELD}
    env.update(AIENG_HOME=str(Path(home).resolve()), AIENG_CONFIG=str(Path(config_path).resolve()))
    return env
