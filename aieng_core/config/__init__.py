"""The YAML configuration, loaded into strict pydantic models.

An unknown key, a wrong type or an out-of-range value stops with a ConfigError that names
the key and the file, because a typo in a config silently falling back to a default is how
a pipeline trains on the wrong thing for a week.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError, model_validator
from pydantic_core import ErrorDetails

from aieng_core.config.landing_section import LandingConfig
from aieng_core.config.pipeline_sections import (
    DataConfig,
    DatasetConfig,
    ModelConfig,
    Section,
    TokenizerConfig,
    TrainingConfig,
)
from aieng_core.config.serving_sections import (
    DEFAULT_GOLDEN_PROMPTS,
    BenchmarkConfig,
    BundleConfig,
    GateConfig,
    ServingConfig,
)
from aieng_core.config.store_sections import StoreConfig
from aieng_core.hashing import sha256_json

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GOLDEN_PROMPTS",
    "TRACEBACK_ENV",
    "AiengConfig",
    "BenchmarkConfig",
    "BundleConfig",
    "ConfigError",
    "DataConfig",
    "DatasetConfig",
    "GateConfig",
    "LandingConfig",
    "ModelConfig",
    "ServingConfig",
    "StoreConfig",
    "TokenizerConfig",
    "TrainingConfig",
    "load_config",
    "resolve_config_path",
    "traceback_requested",
]

DEFAULT_CONFIG = "configs/pipeline.yaml"


# Set (to anything but 0), the `aieng` CLI and a Dagster CLI command that loads the code location
# show the traceback of an error they otherwise print as one line (orchestration/load_errors.py).
TRACEBACK_ENV = "AIENG_TRACEBACK"


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid. Its message is one line that
    names the file and the key: what a command prints, with no traceback around it."""


def traceback_requested() -> bool:
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


class AiengConfig(Section):
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    dataset: DatasetConfig = DatasetConfig()
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    bundle: BundleConfig = BundleConfig()
    serving: ServingConfig = ServingConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    gate: GateConfig = GateConfig()
    store: StoreConfig = StoreConfig()
    landing: LandingConfig = LandingConfig()

    @model_validator(mode="after")
    def _context_fits_model(self) -> AiengConfig:
        if self.bundle.max_context > self.model.max_position_embeddings:
            raise ValueError(
                f"bundle.max_context ({self.bundle.max_context}) exceeds model.max_position_embeddings "
                f"({self.model.max_position_embeddings})"
            )
        for length in self.serving.warmup_prompt_lengths:
            if length >= self.bundle.max_context:
                raise ValueError(
                    f"serving.warmup_prompt_lengths: {length} is not below bundle.max_context "
                    f"({self.bundle.max_context})"
                )
        return self

    def section_values(self, *names: str) -> dict[str, Any]:
        """`{name: values}` of the sections an artifact reads, as JSON: what section_sha256
        hashes, and what a recipe records so `aieng store rebuild` can use these very values
        after the YAML has changed."""
        return {name: getattr(self, name).model_dump(mode="json") for name in names}

    def section_sha256(self, *names: str) -> str:
        """Hash of the sections an artifact reads: it depends on nothing else in the file."""
        values = self.section_values(*names)
        # One section is hashed bare (not under its name): the ids of existing artifacts keep it.
        return sha256_json(values[names[0]] if len(names) == 1 else values)


def resolve_config_path(path: str | os.PathLike | None = None) -> Path:
    """The config file to read: the argument, else $AIENG_CONFIG, else configs/pipeline.yaml.

    A relative default is looked up in the working directory first, then beside the package
    (an editable checkout), so `dagster dev` and `aieng` agree wherever they are started.
    """
    chosen = path or os.environ.get("AIENG_CONFIG") or DEFAULT_CONFIG
    candidate = Path(chosen).expanduser()
    if not candidate.is_absolute() and not candidate.exists() and not (path or os.environ.get("AIENG_CONFIG")):
        beside_package = Path(__file__).resolve().parent.parent / chosen
        if beside_package.exists():
            candidate = beside_package
    return candidate.resolve()


def _format_error(error: ErrorDetails) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "<top level>"
    if error["type"] == "extra_forbidden":
        section, name = (error["loc"] + ("", ""))[:2]
        if section == "serving" and name in BundleConfig.model_fields:
            # The serving: section was split: its recipe keys moved to bundle: (they decide the bundle's id).
            return f"{key}: moved to bundle.{name} (the bundle's recipe; serving: keeps what the server reads)"
        return f"{key}: unknown key"
    return f"{key}: {error['msg']} (got {error.get('input')!r})"


def load_config(path: str | os.PathLike | None = None) -> AiengConfig:
    config_path = resolve_config_path(path)
    try:
        raw = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{config_path}: config file not found") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{config_path}: cannot read config: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{config_path}: top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        return AiengConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_format_error(e) for e in exc.errors())
        raise ConfigError(f"{config_path}: invalid config: {problems}") from None
