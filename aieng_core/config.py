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
    """raw_documents and clean_documents: the landing folder's partitions, the data contract's
    bounds, decoding, and how much is held in memory at once."""

    start_date: dt.date = Field(default=dt.date(2026, 1, 1), strict=False, description="The first daily partition.")
    min_chars: int = Field(default=20, ge=0, description="Shorter clean texts are quarantined as too_short.")
    max_chars: int = Field(default=200_000, ge=1, description="Longer clean texts are quarantined as too_long.")
    batch_rows: int = Field(default=4096, ge=1, le=1_000_000, description="Rows per streamed record batch.")
    batch_bytes: int = Field(
        default=64 << 20,
        ge=1 << 16,
        description="Bytes of records held per batch: with batch_rows, bounds memory whatever the rows hold.",
    )
    max_record_bytes: int = Field(
        default=8 << 20,
        ge=1024,
        description="A record (a line, a CSV record) over this many bytes is record_too_large, never parsed.",
    )
    max_file_bytes: int = Field(
        default=16 << 30,
        ge=1024,
        description="Decompressed bytes read from one landed file; the rest is quarantined as unreadable.",
    )
    fallback_encodings: tuple[str, ...] = Field(
        default=("gb18030",),
        strict=False,
        description="Tried in order after strict UTF-8; GB encodings only where the bytes look like Chinese.",
    )

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
    """bpe_tokenizer and tokenized_documents: the byte-level BPE trained from scratch."""

    vocab_size: int = Field(default=4096, ge=300, le=1_000_000, description="Tokens in the vocabulary.")
    min_frequency: int = Field(default=2, ge=1, description="A pair merged fewer times is not learned.")
    eos_token: str = Field(default="<|endoftext|>", min_length=1, description="Ends every document.")
    pad_token: str = Field(default="<|pad|>", min_length=1, description="Pads batches; never trained on.")
    max_training_chars: int = Field(default=50_000_000, ge=1, description="Cap on the clean text fed to BPE training.")

    @model_validator(mode="after")
    def _distinct_specials(self) -> TokenizerConfig:
        if self.eos_token == self.pad_token:
            raise ValueError("eos_token and pad_token must differ")
        return self


class DatasetConfig(_Section):
    """dataset_manifest: the train/validation split of the tokenized partitions."""

    validation_fraction: float = Field(
        default=0.05, gt=0.0, lt=1.0, strict=False, description="Share of documents (by id) held out for validation."
    )
    split_seed: str = Field(
        default="aieng-split-v1", description="Seeds the split: a document's side depends only on its id and this."
    )


class ModelConfig(_Section):
    """Shape of the Llama-architecture decoder; the vocabulary comes from the tokenizer."""

    hidden_size: int = Field(default=256, ge=8, description="Width of the residual stream.")
    intermediate_size: int = Field(default=688, ge=8, description="SwiGLU width.")
    num_hidden_layers: int = Field(default=4, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(default=8, ge=1, description="Query heads per layer.")
    num_key_value_heads: int = Field(
        default=4, ge=1, description="Key/value heads (grouped-query attention); divides num_attention_heads."
    )
    max_position_embeddings: int = Field(default=256, ge=8, description="The longest sequence the model takes.")
    rope_theta: float = Field(default=10000.0, gt=0, strict=False, description="Rotary embedding base.")
    rms_norm_eps: float = Field(default=1e-5, gt=0, strict=False, description="RMSNorm epsilon.")
    tie_word_embeddings: bool = Field(default=True, description="The output projection shares the input embedding.")

    @model_validator(mode="after")
    def _heads_fit(self) -> ModelConfig:
        if problem := head_shape_problem(self.hidden_size, self.num_attention_heads, self.num_key_value_heads):
            raise ValueError(problem)
        return self


class TrainingConfig(_Section):
    """model_checkpoint: AdamW with linear warmup and cosine decay, resumable checkpoints."""

    block_size: int = Field(default=128, ge=2, description="Tokens per packed training sequence.")
    batch_size: int = Field(default=16, ge=1, description="Sequences per step.")
    max_steps: int = Field(default=400, ge=1, description="Training stops at max_steps or max_minutes, first come.")
    max_minutes: float = Field(
        default=9.0,
        gt=0,
        strict=False,
        description="A run stopped by this publishes a partial model; the next run resumes to max_steps.",
    )
    learning_rate: float = Field(default=2e-3, gt=0, strict=False, description="Peak learning rate.")
    min_learning_rate: float = Field(
        default=2e-4, ge=0, strict=False, description="Where the cosine decay ends; at most learning_rate."
    )
    warmup_steps: int = Field(default=40, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(default=0.1, ge=0, strict=False, description="AdamW weight decay.")
    beta1: float = Field(default=0.9, gt=0, lt=1, strict=False, description="AdamW beta1.")
    beta2: float = Field(default=0.95, gt=0, lt=1, strict=False, description="AdamW beta2.")
    grad_clip: float = Field(default=1.0, gt=0, strict=False, description="Gradient norm clip.")
    eval_every: int = Field(default=100, ge=1, description="Validation loss every N steps.")
    eval_batches: int = Field(default=8, ge=1, description="Validation batches per evaluation.")
    log_every: int = Field(default=25, ge=1, description="A progress line (loss, tokens/s, ETA) every N steps.")
    checkpoint_every: int = Field(default=100, ge=1, description="A resumable checkpoint every N steps.")
    seed: int = Field(default=1337, description="Initialisation and batch order.")
    threads: int = Field(
        default=0, ge=0, description="torch threads; 0: torch's default. Fix it for bit-identical reruns."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: cuda when present, else cpu.")

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


class BundleConfig(_Section):
    """The serving bundle's recipe: what decides its bytes and how it behaves wherever it is
    served (engine limits the goldens depend on, request defaults, golden prompts). Copied
    into each bundle's serving.json and golden.json, and hashed into its id: change one and
    the next bundle is a new one, gated again."""

    max_batch: int = Field(
        default=64, ge=1, le=4096, description="Sequences decoded together; the KV-cache pool holds one slot each."
    )
    max_context: int = Field(
        default=256, ge=8, description="Prompt + generated tokens per sequence; at most model.max_position_embeddings."
    )
    max_prefill_tokens: int = Field(
        default=4096,
        ge=1,
        description="Prompt tokens prefilled per engine step (at least one request is admitted per step).",
    )
    default_max_new_tokens: int = Field(default=64, ge=1, description="Request default when a request names none.")
    default_temperature: float = Field(default=0.0, ge=0.0, strict=False, description="Request default; 0 is greedy.")
    default_top_k: int = Field(default=0, ge=0, description="Request default; 0: no top-k cut.")
    default_top_p: float = Field(default=1.0, gt=0.0, le=1.0, strict=False, description="Request default.")
    golden_prompts: tuple[str, ...] = Field(
        default=DEFAULT_GOLDEN_PROMPTS,
        strict=False,
        min_length=1,
        description="Greedy continuations of these are recorded in the bundle at build time and replayed by "
        "`aieng bundle verify`, every load and the gate.",
    )
    golden_max_new_tokens: int = Field(default=16, ge=1, description="Tokens generated per golden prompt.")
    golden_threads: int = Field(
        default=0,
        ge=0,
        description="torch threads the goldens are recorded with (replays use the same count: CPU reductions "
        "split their work by thread count); 0: torch's default on the building machine.",
    )
    allow_partial_model: bool = Field(
        default=False, description="Bundle a model stopped by training.max_minutes before max_steps."
    )

    @model_validator(mode="after")
    def _goldens_named(self) -> BundleConfig:
        if any(not prompt for prompt in self.golden_prompts):
            raise ValueError("golden_prompts: a prompt is empty")
        return self


class ServingConfig(_Section):
    """What only the running server reads (`aieng serve` and the gate's servers): how it behaves
    under load, on which device and threads. Never part of a bundle or its id: changing one
    restarts a server, it does not rebuild or re-gate a bundle."""

    max_waiting: int = Field(
        default=256, ge=1, description="Requests queued for a KV-cache slot; beyond this the server answers 429."
    )
    request_timeout_s: float = Field(
        default=60.0, gt=0, strict=False, description="Wall-clock limit of one request, queue time included: 504."
    )
    max_request_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        le=1 << 30,
        description="Request bodies over this many bytes get 413, read no further than the limit.",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        ge=0,
        strict=False,
        description="After SIGTERM: how long in-flight requests may take to finish before the server exits.",
    )
    threads: int = Field(default=0, ge=0, description="torch intra-op threads of the server; 0: torch's default.")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: cuda when present, else cpu.")
    warmup_prompt_lengths: tuple[int, ...] = Field(
        default=(8, 32, 128),
        strict=False,
        description="One warmup generation per prompt length before /health/ready turns 200; lengths not "
        "below the bundle's max_context are skipped.",
    )

    @field_validator("warmup_prompt_lengths")
    @classmethod
    def _positive_lengths(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if any(value < 1 for value in values):
            raise ValueError("every length must be at least 1")
        return values


class BenchmarkConfig(_Section):
    """benchmark_report: a model's quality, speed and memory through our engine, with
    transformers `generate` measured beside it in the same run."""

    batch_sizes: tuple[int, ...] = Field(
        default=(1, 16, 64), strict=False, min_length=1, description="Throughput: sequences decoded together."
    )
    prompt_tokens: int = Field(default=16, ge=1, description="Prompt length of every benchmark request.")
    new_tokens: int = Field(default=32, ge=2, description="Tokens generated per benchmark request.")
    concurrencies: tuple[int, ...] = Field(
        default=(1, 4, 16),
        strict=False,
        min_length=1,
        description="Latency: requests kept in flight at once (closed loop), requests_per_level each.",
    )
    requests_per_level: int = Field(default=32, ge=1, description="Requests per latency level.")
    compare_transformers: bool = Field(
        default=True, description="transformers `generate` (greedy, use_cache) on the same weights, same run."
    )
    max_seconds: float = Field(
        default=300.0, gt=0, strict=False, description="The report stops (and says so) rather than run longer."
    )
    threads: int = Field(default=0, ge=0, description="torch threads while measuring; 0: torch's default.")

    @field_validator("batch_sizes", "concurrencies")
    @classmethod
    def _positive(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if any(value < 1 for value in values):
            raise ValueError("every value must be at least 1")
        return values


class GateConfig(_Section):
    """production_deployment: the promotion gate's stress test, SLOs, rollback drill, and the
    retrain schedule that feeds it."""

    concurrencies: tuple[int, ...] = Field(
        default=(1, 8, 32), strict=False, min_length=1, description="Closed-loop stress: clients per level."
    )
    poisson_rates: tuple[float, ...] = Field(
        default=(4.0, 16.0), strict=False, description="Open-loop stress: Poisson arrival rates (requests/s)."
    )
    requests_per_level: int = Field(default=64, ge=1, description="Requests per stress level.")
    max_new_tokens: tuple[int, ...] = Field(
        default=(16, 32, 64), strict=False, min_length=1, description="Cycled over the stress requests."
    )
    max_seconds_per_level: float = Field(
        default=120.0, gt=0, strict=False, description="A stress level still running after this fails."
    )
    slo_ttft_p99_ms: float = Field(
        default=2000.0, gt=0, strict=False, description="SLO: P99 time to first token, at every level."
    )
    slo_e2el_p99_ms: float = Field(
        default=10000.0, gt=0, strict=False, description="SLO: P99 end-to-end latency, at every level."
    )
    slo_ttft_ms: float = Field(
        default=1000.0, gt=0, strict=False, description="Goodput: a request is good within this TTFT..."
    )
    slo_tpot_ms: float = Field(default=100.0, gt=0, strict=False, description="...and this TPOT.")
    goodput_floor: float = Field(
        default=0.9, ge=0.0, le=1.0, strict=False, description="Fraction of good requests required at every level."
    )
    max_regression: float = Field(
        default=0.10,
        ge=0.0,
        strict=False,
        description="Candidate vs the deployed bundle's gate figures: at most this much worse.",
    )
    drill_clients: int = Field(
        default=2, ge=1, description="Rollback drill: clients sending light traffic while the drill pointer switches."
    )
    retrain_cron: str = Field(
        default="0 3 * * 1",
        min_length=9,
        description="Retrain schedule (cron, UTC): dataset_manifest -> model -> benchmark -> bundle.",
    )

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
    bundle: BundleConfig = BundleConfig()
    serving: ServingConfig = ServingConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    gate: GateConfig = GateConfig()

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
