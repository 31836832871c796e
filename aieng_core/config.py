"""The YAML configuration, loaded into strict pydantic models.

An unknown key, a wrong type or an out-of-range value stops with a ConfigError that names
the key and the file, because a typo in a config silently falling back to a default is how
a pipeline trains on the wrong thing for a week.
"""

from __future__ import annotations

import codecs
import datetime as dt
import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from aieng_core.hashing import sha256_json
from aieng_core.model.shape import head_shape_problem

DEFAULT_CONFIG = "configs/pipeline.yaml"


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class DataConfig(_Section):
    start_date: dt.date = Field(default=dt.date(2026, 1, 1), strict=False)
    min_chars: int = Field(default=20, ge=0)
    max_chars: int = Field(default=200_000, ge=1)
    batch_rows: int = Field(default=4096, ge=1, le=1_000_000)
    # Bytes of records held per batch: with batch_rows, bounds memory whatever the rows hold.
    batch_bytes: int = Field(default=64 << 20, ge=1 << 16)
    # A record (a line, a CSV record) over this many bytes is record_too_large, never parsed.
    max_record_bytes: int = Field(default=8 << 20, ge=1024)
    # Decompressed bytes read from one landed file; the rest is quarantined as unreadable.
    max_file_bytes: int = Field(default=16 << 30, ge=1024)
    # Tried in order after strict UTF-8; GB encodings only where the bytes look like Chinese.
    fallback_encodings: tuple[str, ...] = Field(default=("gb18030",), strict=False)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> DataConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must not exceed max_chars ({self.max_chars})")
        if self.max_record_bytes > self.max_file_bytes:
            raise ValueError(
                f"max_record_bytes ({self.max_record_bytes}) must not exceed max_file_bytes ({self.max_file_bytes})"
            )
        return self

    @field_validator("fallback_encodings")
    @classmethod
    def _known_encodings(cls, encodings: tuple[str, ...]) -> tuple[str, ...]:
        names = []
        for encoding in encodings:
            try:
                name = codecs.lookup(encoding).name
            except LookupError:
                raise ValueError(f"unknown encoding {encoding!r}") from None
            if name.startswith(("utf-8", "utf_8", "utf-16", "utf-32")):
                raise ValueError(f"{encoding!r}: UTF encodings are detected already (strict UTF-8, byte-order marks)")
            if name in names:
                raise ValueError(f"{encoding!r} is listed twice")
            names.append(name)
        return tuple(names)


class TokenizerConfig(_Section):
    vocab_size: int = Field(default=4096, ge=300, le=1_000_000)
    min_frequency: int = Field(default=2, ge=1)
    eos_token: str = Field(default="<|endoftext|>", min_length=1)
    pad_token: str = Field(default="<|pad|>", min_length=1)
    max_training_chars: int = Field(default=50_000_000, ge=1)

    @model_validator(mode="after")
    def _distinct_specials(self) -> TokenizerConfig:
        if self.eos_token == self.pad_token:
            raise ValueError("eos_token and pad_token must differ")
        return self


class DatasetConfig(_Section):
    validation_fraction: float = Field(default=0.05, gt=0.0, lt=1.0, strict=False)
    split_seed: str = "aieng-split-v1"


class ModelConfig(_Section):
    """Shape of the Llama-architecture decoder; the vocabulary comes from the tokenizer."""

    hidden_size: int = Field(default=256, ge=8)
    intermediate_size: int = Field(default=688, ge=8)
    num_hidden_layers: int = Field(default=4, ge=1)
    num_attention_heads: int = Field(default=8, ge=1)
    num_key_value_heads: int = Field(default=4, ge=1)
    max_position_embeddings: int = Field(default=256, ge=8)
    rope_theta: float = Field(default=10000.0, gt=0, strict=False)
    rms_norm_eps: float = Field(default=1e-5, gt=0, strict=False)
    tie_word_embeddings: bool = True

    @model_validator(mode="after")
    def _heads_fit(self) -> ModelConfig:
        if problem := head_shape_problem(self.hidden_size, self.num_attention_heads, self.num_key_value_heads):
            raise ValueError(problem)
        return self


class TrainingConfig(_Section):
    block_size: int = Field(default=128, ge=2)
    batch_size: int = Field(default=16, ge=1)
    max_steps: int = Field(default=400, ge=1)
    max_minutes: float = Field(default=9.0, gt=0, strict=False)
    learning_rate: float = Field(default=2e-3, gt=0, strict=False)
    min_learning_rate: float = Field(default=2e-4, ge=0, strict=False)
    warmup_steps: int = Field(default=40, ge=0)
    weight_decay: float = Field(default=0.1, ge=0, strict=False)
    beta1: float = Field(default=0.9, gt=0, lt=1, strict=False)
    beta2: float = Field(default=0.95, gt=0, lt=1, strict=False)
    grad_clip: float = Field(default=1.0, gt=0, strict=False)
    eval_every: int = Field(default=100, ge=1)
    eval_batches: int = Field(default=8, ge=1)
    log_every: int = Field(default=25, ge=1)
    checkpoint_every: int = Field(default=100, ge=1)
    seed: int = 1337
    threads: int = Field(default=0, ge=0)  # 0: torch's default
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _schedule_fits(self) -> TrainingConfig:
        if self.min_learning_rate > self.learning_rate:
            raise ValueError(
                f"min_learning_rate ({self.min_learning_rate}) must not exceed learning_rate ({self.learning_rate})"
            )
        return self


DEFAULT_GOLDEN_PROMPTS = (
    "The data pipeline",
    "A model is trained",
    "数据清洗",
    "Once upon a time",
)


class ServingConfig(_Section):
    """Engine limits and request defaults: copied into each serving bundle as serving.json."""

    # Sequences decoded together; the KV-cache pool holds one slot per sequence.
    max_batch: int = Field(default=64, ge=1, le=4096)
    # Prompt + generated tokens per sequence; at most model.max_position_embeddings.
    max_context: int = Field(default=256, ge=8)
    # Requests queued for a slot; beyond this the server answers 429.
    max_waiting: int = Field(default=256, ge=1)
    # Prompt tokens prefilled per engine step (at least one request is admitted per step).
    max_prefill_tokens: int = Field(default=4096, ge=1)
    default_max_new_tokens: int = Field(default=64, ge=1)
    default_temperature: float = Field(default=0.0, ge=0.0, strict=False)
    default_top_k: int = Field(default=0, ge=0)
    default_top_p: float = Field(default=1.0, gt=0.0, le=1.0, strict=False)
    # Wall-clock limit of one request, queue time included: 504 when exceeded.
    request_timeout_s: float = Field(default=60.0, gt=0, strict=False)
    # Request bodies over this many bytes get 413, read no further than the limit.
    max_request_bytes: int = Field(default=1 << 20, ge=1024, le=1 << 30)
    # After SIGTERM: how long in-flight requests may take to finish before the server exits.
    drain_timeout_s: float = Field(default=30.0, ge=0, strict=False)
    threads: int = Field(default=0, ge=0)  # 0: torch's default
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # One warmup generation per prompt length before readiness turns 200.
    warmup_prompt_lengths: tuple[int, ...] = Field(default=(8, 32, 128), strict=False)
    # Greedy continuations recorded in the bundle at build time and replayed by `aieng bundle verify`.
    golden_prompts: tuple[str, ...] = Field(default=DEFAULT_GOLDEN_PROMPTS, strict=False, min_length=1)
    golden_max_new_tokens: int = Field(default=16, ge=1)
    # A model stopped by max_minutes before max_steps is not bundled unless this says so.
    allow_partial_model: bool = False

    @model_validator(mode="after")
    def _lengths_fit(self) -> ServingConfig:
        for length in self.warmup_prompt_lengths:
            if not 1 <= length < self.max_context:
                raise ValueError(f"warmup_prompt_lengths: {length} is not in [1, max_context={self.max_context})")
        if any(not prompt for prompt in self.golden_prompts):
            raise ValueError("golden_prompts: a prompt is empty")
        return self


class BenchmarkConfig(_Section):
    """benchmark_report: a model's quality, speed and memory through our engine, with
    transformers `generate` measured beside it in the same run."""

    # Throughput: this many sequences decoded together, each prompt_tokens long, new_tokens generated.
    batch_sizes: tuple[int, ...] = Field(default=(1, 16, 64), strict=False, min_length=1)
    prompt_tokens: int = Field(default=16, ge=1)
    new_tokens: int = Field(default=32, ge=2)
    # Latency: this many requests kept in flight at once (closed loop), requests_per_level each.
    concurrencies: tuple[int, ...] = Field(default=(1, 4, 16), strict=False, min_length=1)
    requests_per_level: int = Field(default=32, ge=1)
    compare_transformers: bool = True
    # The whole report stops (and says so) rather than run longer than this.
    max_seconds: float = Field(default=300.0, gt=0, strict=False)
    threads: int = Field(default=0, ge=0)  # 0: torch's default

    @field_validator("batch_sizes", "concurrencies")
    @classmethod
    def _positive(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if any(value < 1 for value in values):
            raise ValueError("every value must be at least 1")
        return values


class GateConfig(_Section):
    """production_deployment: the promotion gate's stress test, SLOs, rollback drill, and the
    retrain schedule that feeds it."""

    # Closed-loop stress: this many clients each; open loop: Poisson arrivals at these rates (req/s).
    concurrencies: tuple[int, ...] = Field(default=(1, 8, 32), strict=False, min_length=1)
    poisson_rates: tuple[float, ...] = Field(default=(4.0, 16.0), strict=False)
    requests_per_level: int = Field(default=64, ge=1)
    max_new_tokens: tuple[int, ...] = Field(default=(16, 32, 64), strict=False, min_length=1)  # cycled
    max_seconds_per_level: float = Field(default=120.0, gt=0, strict=False)
    # SLOs: P99 time to first token and end-to-end latency; a request is "good" (goodput) when
    # its TTFT and TPOT are within slo_ttft_ms and slo_tpot_ms.
    slo_ttft_p99_ms: float = Field(default=2000.0, gt=0, strict=False)
    slo_e2el_p99_ms: float = Field(default=10000.0, gt=0, strict=False)
    slo_ttft_ms: float = Field(default=1000.0, gt=0, strict=False)
    slo_tpot_ms: float = Field(default=100.0, gt=0, strict=False)
    # Fraction of requests that must be good, at every load level.
    goodput_floor: float = Field(default=0.9, ge=0.0, le=1.0, strict=False)
    # Candidate vs the deployed bundle's gate figures: at most this much worse.
    max_regression: float = Field(default=0.10, ge=0.0, strict=False)
    # Rollback drill: clients sending light traffic while the drill pointer switches.
    drill_clients: int = Field(default=2, ge=1)
    # Retrain schedule (cron, UTC): dataset_manifest -> model -> benchmark -> bundle.
    retrain_cron: str = Field(default="0 3 * * 1", min_length=9)

    @field_validator("concurrencies", "max_new_tokens")
    @classmethod
    def _positive(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if any(value < 1 for value in values):
            raise ValueError("every value must be at least 1")
        return values

    @field_validator("poisson_rates")
    @classmethod
    def _positive_rates(cls, values: tuple[float, ...]) -> tuple[float, ...]:
        if any(value <= 0 for value in values):
            raise ValueError("every rate must be above 0")
        return values


class AiengConfig(_Section):
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    dataset: DatasetConfig = DatasetConfig()
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    serving: ServingConfig = ServingConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    gate: GateConfig = GateConfig()

    @model_validator(mode="after")
    def _context_fits_model(self) -> AiengConfig:
        if self.serving.max_context > self.model.max_position_embeddings:
            raise ValueError(
                f"serving.max_context ({self.serving.max_context}) exceeds model.max_position_embeddings "
                f"({self.model.max_position_embeddings})"
            )
        return self

    def section_sha256(self, *names: str) -> str:
        """Hash of the sections an artifact reads: it depends on nothing else in the file."""
        if len(names) == 1:
            return sha256_json(getattr(self, names[0]).model_dump(mode="json"))
        return sha256_json({name: getattr(self, name).model_dump(mode="json") for name in names})


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
