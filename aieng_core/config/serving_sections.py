"""The sections of the config from the bundle on: bundle (the bundle's recipe, in its id),
serving (what only the running server reads), benchmark, gate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict, field_validator, model_validator

from aieng_core.config.pipeline_sections import Section
from aieng_core.cpu.governor import thread_ladder

DEFAULT_GOLDEN_PROMPTS = (
    "The data pipeline",
    "A model is trained",
    "数据清洗",
    "Once upon a time",
)

# The demo model learns plain text, and its tokenizer has no chat tokens (special-token text
# in a prompt stays text: tokenizer/bpe.py), so the turns are marked in plain text. A
# conversation ends where the model emits EOS, as a document does.
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{%- if message['role'] not in ('system', 'user', 'assistant') %}\n"
    "{{- raise_exception('roles are system, user and assistant, not ' ~ message['role']) }}\n"
    "{%- endif %}\n"
    "{{- '### ' ~ message['role'] ~ '\\n' ~ message['content'] ~ '\\n\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '### assistant\\n' }}\n"
    "{%- endif %}\n"
)


class ChatTurn(Section):
    """One message of a golden conversation."""

    role: Literal["system", "user", "assistant"]
    content: str = Field(min_length=1)


DEFAULT_GOLDEN_CONVERSATIONS = (
    (ChatTurn(role="user", content="What does the pipeline do?"),),
    (ChatTurn(role="system", content="Be brief."), ChatTurn(role="user", content="数据清洗?")),
)


class BundleConfig(Section):
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
        default=256,
        ge=1,
        description=(
            "Prompt tokens prefilled per engine step, beside the running decodes: a longer prompt (or a burst of "
            "prompts) is prefilled in chunks over several steps, so no step stalls every stream for longer."
        ),
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
    chat_template: str | None = Field(
        default=DEFAULT_CHAT_TEMPLATE,
        min_length=1,
        description=(
            "Jinja chat template, written into the bundle's tokenizer_config.json as transformers reads it "
            "(AutoTokenizer.apply_chat_template renders the same prompt); /v1/chat/completions renders "
            "conversations through it. null: the bundle has none, and chat requests get a 400 saying so."
        ),
    )
    golden_conversations: tuple[Annotated[tuple[ChatTurn, ...], Strict(False)], ...] = Field(
        default=DEFAULT_GOLDEN_CONVERSATIONS,
        strict=False,
        description="Rendered through chat_template, their greedy replies are recorded with the golden prompts "
        "and replayed with them; each replay also renders the conversation again and must give the recorded "
        "prompt. Ignored without a chat_template.",
    )
    golden_threads: int = Field(
        default=0,
        ge=0,
        description="torch threads the goldens are recorded with (replays use the same count: CPU reductions "
        "split their work by thread count); 0: torch's default on the building machine.",
    )
    allow_partial_model: bool = Field(
        default=False, description="Bundle a model stopped by training.max_minutes before max_steps."
    )
    weights: Literal["fp32", "int8"] = Field(
        default="fp32",
        description=(
            "int8: the bundle built is the int8 variant of the float32 one (which is built too, and named in the "
            "variant's manifest as its source): weight-only int8, per output channel, float32 matmuls "
            "(model/int8_weights.py names the method). A blocking check refuses it when its bits per byte on "
            "held-out text is worse than the float32 model's by more than gate.int8_max_quality_regression. "
            "fp32 bundles keep the ids they had before this key existed."
        ),
    )

    @model_validator(mode="after")
    def _goldens_named(self) -> BundleConfig:
        if any(not prompt for prompt in self.golden_prompts):
            raise ValueError("golden_prompts: a prompt is empty")
        if any(not conversation for conversation in self.golden_conversations):
            raise ValueError("golden_conversations: a conversation is empty")
        return self


class ServingConfig(Section):
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
    shutdown_delay_s: float = Field(
        default=0.0,
        ge=0,
        le=300,
        strict=False,
        description=(
            "After SIGTERM: readiness turns 503 at once, but new requests are still served for this long, "
            "so a load balancer takes the replica out of rotation before it refuses any; then the drain "
            "(drain_timeout_s) begins. Set it above the balancer's time to mark a replica down."
        ),
    )
    prefix_cache_tokens: int = Field(
        default=4096,
        ge=0,
        description=(
            "Prompt tokens whose keys and values the server keeps for reuse (prefix caching, "
            "serving/prefix_cache.py): a prompt starting with a cached prefix (a chat's system prompt) prefills "
            "only the rest. In blocks of 16 tokens, keyed by the bundle and every token before the block's end; "
            "least recently used first out. Preallocated at start, beside the KV-cache pool; 0: off."
        ),
    )
    threads: int = Field(
        default=0,
        ge=0,
        description=(
            "torch intra-op threads of the server's engine, at most; 0: the cores the process really has (its "
            "affinity mask and its cgroup's CPU limit, rounded down: cpu/quota.py), not the host's count."
        ),
    )
    adapt_threads: bool = Field(
        default=True,
        description=(
            "Step with fewer threads while other processes take this server's cores (cpu/governor.py): every "
            "0.25 s the server measures the CPU others took on its cores and runs the largest of serving.threads, "
            "halved down to 1, that fits in what they leave (down at once, up after 1 s). A team of OpenMP threads "
            "beside a busy process waits at every barrier for a descheduled thread (on 2 cores the server fell "
            "from 6,911 to 59 tokens/s). The decode step graphs are captured at each of those counts. false: always "
            "serving.threads."
        ),
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: cuda when present, else cpu.")
    step_graphs: Literal["auto", "compile", "eager"] = Field(
        default="auto",
        description=(
            "Decode steps as compiled graphs captured at warmup, one per batch bucket (serving/step_graphs.py): "
            "compile: torch.compile (inductor) on the CPU; auto: compile when a C++ compiler is found (on CUDA "
            "every step runs eagerly for now, and warmup says so); eager: never."
        ),
    )
    warmup_max_seconds: float = Field(
        default=120.0,
        ge=0.0,
        strict=False,
        description=(
            "Capturing the step graphs stops after this long (buckets left run eagerly, and warmup says which); "
            "compiled code is cached under $AIENG_HOME/cache/step-graphs, so a restart pays much less (the "
            "pipeline model: about 60 s cold on 2 cores, 10 s from the cache). Keep it well under the 180 s a "
            "server gets to become ready in the gate and the benchmark."
        ),
    )
    warmup_prompt_lengths: tuple[int, ...] = Field(
        default=(8, 32, 128),
        strict=False,
        description="One warmup generation per prompt length before /health/ready turns 200. Each must be "
        "below bundle.max_context (checked when the config loads); a served bundle built with a shorter "
        "context skips the lengths that do not fit it.",
    )

    def thread_counts(self, cores: int) -> tuple[int, ...]:
        """The thread counts the engine steps at, most first, on a process that has `cores`
        (cpu/quota.py): serving.threads (0: `cores`), then halved down to 1 when adapt_threads."""
        top = self.threads or cores
        return thread_ladder(top) if self.adapt_threads else (top,)

    @model_validator(mode="before")
    @classmethod
    def _weights_are_the_bundles(cls, data: object) -> object:
        if isinstance(data, dict) and "weights" in data:
            raise ValueError(
                "weights is not a serving: key: the weights decide a bundle's bytes, so they are bundle.weights "
                "(fp32 or int8); the serving: section never changes a bundle"
            )
        return data

    @field_validator("warmup_prompt_lengths")
    @classmethod
    def _positive_lengths(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        if any(value < 1 for value in values):
            raise ValueError("every length must be at least 1")
        return values


class BenchmarkConfig(Section):
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


class GateConfig(Section):
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
    busy_cores_limit: float = Field(
        default=0.5,
        ge=0.0,
        strict=False,
        description=(
            "Stress: a level that breaks a latency, goodput or time SLO while other processes took at least this "
            "many of the cores the gate may use (measured during the level) says nothing of the bundle: when every "
            "broken level was so busy, the gate is inconclusive (production unchanged, the bundle not refused, "
            "`aieng deploy gate` exits 75) instead of failed. 0.5: where the server steps down a thread. A value "
            "above the machine's cores turns the rule off."
        ),
    )
    busy_retries: int = Field(
        default=2,
        ge=0,
        description=(
            "production_deployment in Dagster: an inconclusive gate is run again by the same run this many times "
            "(a step retry, busy_retry_seconds apart); after the last, the run fails as inconclusive."
        ),
    )
    busy_retry_seconds: float = Field(
        default=300.0,
        ge=0.0,
        strict=False,
        description="production_deployment in Dagster: the wait before each retry of an inconclusive gate.",
    )
    max_regression: float = Field(
        default=0.10,
        ge=0.0,
        strict=False,
        description=(
            "Speed: the candidate fails only when the confidence interval of its median end-to-end latency over "
            "the deployed bundle's (both served in this gate run, interleaved) lies above 1 + this."
        ),
    )
    max_quality_regression: float = Field(
        default=0.02,
        ge=0.0,
        strict=False,
        description=(
            "Quality: the candidate's bits per byte on the held-out text may be at most this fraction above the "
            "deployed model's (and must be below the unigram baseline's)."
        ),
    )
    quality_min_text_bytes: int = Field(
        default=16384,
        ge=0,
        description=(
            "Quality: a held-out text shorter than this (UTF-8 bytes) is not judged on its own, only in the pooled "
            "text: a few documents' bits per byte is too noisy to refuse a candidate on."
        ),
    )
    int8_max_quality_regression: float = Field(
        default=0.01,
        ge=0.0,
        strict=False,
        description=(
            "An int8 variant (bundle.weights: int8) is refused when its bits per byte on the held-out text is more "
            "than this fraction above its float32 source's (the bundle check and the gate both decide so)."
        ),
    )
    compare_rounds: int = Field(
        default=2,
        ge=1,
        description="Speed comparison: rounds of candidate then deployed bundle (ABAB...), each in a fresh server.",
    )
    compare_max_rounds: int = Field(
        default=4,
        ge=1,
        description=(
            "Speed comparison: rounds are added one at a time, up to this many, while the answer is open (the "
            "median ratio above the limit, its interval reaching below it); never fewer than compare_rounds."
        ),
    )
    compare_requests: int = Field(
        default=24, ge=2, description="Speed comparison: requests per bundle per round (closed loop)."
    )
    compare_concurrency: int = Field(
        default=1, ge=1, description="Speed comparison: clients, each sending its pairs one request at a time."
    )
    compare_confidence: float = Field(
        default=0.99,
        gt=0.5,
        lt=1.0,
        strict=False,
        description="Speed comparison: confidence level of the bootstrap interval the regression decision uses.",
    )
    rollback_check_cron: str = Field(
        default="23 * * * *",
        min_length=9,
        description="Rollback readiness check (cron, UTC): re-verify, load and replay the rollback target's goldens.",
    )
    drill_clients: int = Field(
        default=2, ge=1, description="Rollback drill: clients sending light traffic while the drill pointer switches."
    )
    retrain: Literal["on_new_data", "cron", "manual"] = Field(
        default="on_new_data",
        description=(
            "When model_checkpoint -> benchmark_report -> serving_bundle run by themselves (declarative automation, "
            "with the daemon running): on_new_data, when the dataset manifest changed and the last training "
            "started at least retrain_min_interval_minutes ago; cron, on retrain_cron; manual, never."
        ),
    )
    retrain_min_interval_minutes: int = Field(
        default=60, ge=0, description="on_new_data: the least time between the starts of two trainings."
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
