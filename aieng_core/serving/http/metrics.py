"""Prometheus metrics of the server, named after vLLM's so that people who run vLLM read them
at once, but with Prometheus' own naming rule: no colons (those are for recording rules).

The server owns one CollectorRegistry (not the process-global default), so two apps in one
process, as tests make, never collide; it also carries prometheus_client's process collector
(process_resident_memory_bytes, process_cpu_seconds_total, ...).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from aieng_core.store.request_log import NO_BUNDLE

# Latency buckets in seconds: a tiny CPU model answers in milliseconds, a loaded server in
# tens of seconds; vLLM's buckets span the same range.
REQUEST_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TOKEN_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

# Every metric the server exports: name -> meaning. The metrics reference page
# (docs/reference/metrics.md) is generated from this registry, and a test checks /metrics
# exposes each one.
METRIC_HELP: dict[str, str] = {
    "aieng_time_to_first_token_seconds": "Time from a request's arrival to its first generated token.",
    "aieng_inter_token_latency_seconds": "Time between two consecutive generated tokens of one request.",
    "aieng_e2e_request_latency_seconds": "Time from a request's arrival to its last token (queue time included).",
    "aieng_request_queue_time_seconds": "Time a request waited for a KV-cache slot before its prefill.",
    "aieng_num_requests_running": "Requests holding a KV-cache slot (being decoded).",
    "aieng_num_requests_waiting": "Requests queued for a KV-cache slot.",
    "aieng_max_num_requests_waiting": "Requests the queue holds before new ones get 429 (serving.max_waiting).",
    "aieng_request_success_total": "Requests the engine finished, by finish reason (stop, length, cancelled, ...).",
    "aieng_prompt_tokens_total": "Prompt tokens of finished requests (a prompt with n samples counted once).",
    "aieng_generation_tokens_total": "Tokens generated (cancelled requests' tokens included).",
    "aieng_http_requests_total": "HTTP requests answered, by endpoint and status code.",
    "aieng_kv_cache_free_slots": "KV-cache slots free for a new sequence.",
    "aieng_kv_cache_slots": "KV-cache slots in the pool (the engine's max_batch).",
    "aieng_kv_cache_bytes": "Bytes preallocated by the KV-cache pool.",
    "aieng_prefix_cache_queries_total": "Prompt tokens of requests that took a KV-cache slot, each looked up in the "
    "prefix cache (serving.prefix_cache_tokens).",
    "aieng_prefix_cache_hits_total": "Of those prompt tokens, the ones whose keys and values came from the prefix "
    "cache instead of a prefill.",
    "aieng_prefix_cache_hit_rate": "aieng_prefix_cache_hits_total / aieng_prefix_cache_queries_total since the "
    "server started (0 before any query); for a window, divide the counters' rates.",
    "aieng_prefix_cache_blocks": "Blocks of 16 prompt tokens held in the prefix cache now.",
    "aieng_prefix_cache_bytes": "Bytes preallocated by the prefix cache (0: off).",
    "aieng_process_resident_memory_bytes": "Resident memory of the server process (RSS).",
    "aieng_engine_threads": "torch threads the engine's steps run with now: serving.threads (0: the cores the "
    "process has), fewer while other processes take its cores (serving.adapt_threads).",
    "aieng_cpu_other_processes_cores": "CPU other processes took on this server's CPUs in the last 0.25 s window, "
    "in cores (/proc/stat less this process): what aieng_engine_threads follows; 0 when adapt_threads is off.",
    "aieng_compiled_graphs": "Graphs torch.compile has compiled in this process (the decode step graphs, at "
    "warmup): one more after /health/ready turned 200 is a step that compiled while serving.",
    "aieng_kv_cache_allocations": "Tensors allocated for KV-cache pools and prefix caches in this process: all at "
    "a replica's start (the pool is preallocated); never while serving.",
    "aieng_batch_size": "Sequences run by one engine step (prefill plus decode).",
    "aieng_requests_rejected_total": "Generation requests refused: overloaded (429), draining (503), timeout (504).",
    "aieng_bundle_info": "The serving bundle in use (label bundle_id), always 1.",
    "aieng_ready": "1 while /health/ready answers 200 (a bundle loaded and warm, not draining), else 0.",
    "aieng_config_valid": "1 while the config file the server was started with (label path) loads, 0 while it "
    "does not (re-read on each scrape when it changed; the log line says which key and why); a Dagster code "
    "location reading it cannot load meanwhile.",
    # Only from a server that follows a deployment pointer (`aieng serve --deployment current`):
    "aieng_deployment_mismatch": "Following a pointer: 1 while the pointer names a bundle this server refused "
    "(pointer_bundle) and it keeps serving another (served_bundle); 0 while they agree or a new one loads.",
    "aieng_rollback_target_ready": "Following a pointer: 1 when the last rollback readiness check passed for the "
    "pointer's current state, 0 when it failed, is stale (the pointer moved since) or its file is damaged; "
    "no series before a first check or with nothing to roll back to.",
    "aieng_rollback_check_stale": "Following a pointer: 1 when the last rollback readiness check ran before the "
    "pointer's last change (it checked another rollback target), else 0; no series before a first check.",
    "aieng_rollback_check_age_seconds": "Following a pointer: seconds since the last rollback readiness check ran; "
    "no series before a first check.",
}
# The series only a server following a deployment pointer exports.
POINTER_METRICS = (
    "aieng_deployment_mismatch",
    "aieng_rollback_target_ready",
    "aieng_rollback_check_stale",
    "aieng_rollback_check_age_seconds",
)

REJECT_REASONS = ("overloaded", "draining", "not_ready", "timeout")
BUNDLE = "bundle_id"  # the label naming the bundle that answered

# The endpoints counted by path in aieng_http_requests_total (anything else is "other", so a
# scanner cannot grow the label set).
GENERATION_ENDPOINTS = ("/generate", "/predict", "/v1/completions", "/v1/chat/completions")
ENDPOINTS = (
    *GENERATION_ENDPOINTS,
    "/v1/models",
    "/health/live",
    "/health/ready",
    "/version",
    "/metrics",
    "/admin/reload",
)


def _rss_bytes() -> float:
    """Resident set size from /proc (Linux); psutil elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return float(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        import psutil

        return float(psutil.Process().memory_info().rss)


def _compiled_graphs() -> float:
    """dynamo's count of the graphs it compiled in this process (0 before torch._dynamo is imported)."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    return float(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0.0


class ServingMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        r = self.registry
        h = METRIC_HELP
        self.ttft = Histogram(
            "aieng_time_to_first_token_seconds", h["aieng_time_to_first_token_seconds"],
            [BUNDLE], buckets=REQUEST_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "aieng_inter_token_latency_seconds", h["aieng_inter_token_latency_seconds"],
            [BUNDLE], buckets=TOKEN_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "aieng_e2e_request_latency_seconds", h["aieng_e2e_request_latency_seconds"],
            [BUNDLE], buckets=REQUEST_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            "aieng_request_queue_time_seconds", h["aieng_request_queue_time_seconds"],
            [BUNDLE], buckets=REQUEST_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.batch_size = Histogram("aieng_batch_size", h["aieng_batch_size"], buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.running = Gauge("aieng_num_requests_running", h["aieng_num_requests_running"], registry=r)
        self.waiting = Gauge("aieng_num_requests_waiting", h["aieng_num_requests_waiting"], registry=r)
        # The queue's limit and the readiness, so that alerts need no copy of the config and
        # see what a load balancer sees (configs/alerts.yml: queue near full, not ready).
        self.max_waiting = Gauge("aieng_max_num_requests_waiting", h["aieng_max_num_requests_waiting"], registry=r)
        self.ready = Gauge("aieng_ready", h["aieng_ready"], registry=r)
        # Counter names are given without _total: prometheus_client appends it.
        # Every series about an answer carries the bundle that answered (bundle_id; "none" when
        # none could): during a canary rollout, each side is read apart.
        self.success = Counter(
            "aieng_request_success", h["aieng_request_success_total"], ["finished_reason", BUNDLE], registry=r
        )
        self.prompt_tokens = Counter("aieng_prompt_tokens", h["aieng_prompt_tokens_total"], [BUNDLE], registry=r)
        self.generation_tokens = Counter(
            "aieng_generation_tokens", h["aieng_generation_tokens_total"], [BUNDLE], registry=r
        )
        self.http_requests = Counter(
            "aieng_http_requests", h["aieng_http_requests_total"], ["endpoint", "status", BUNDLE], registry=r
        )
        self.rejected = Counter(
            "aieng_requests_rejected", h["aieng_requests_rejected_total"], ["reason", BUNDLE], registry=r
        )
        self.export_rejections(NO_BUNDLE)
        self.kv_free_slots = Gauge("aieng_kv_cache_free_slots", h["aieng_kv_cache_free_slots"], registry=r)
        self.kv_slots = Gauge("aieng_kv_cache_slots", h["aieng_kv_cache_slots"], registry=r)
        self.kv_bytes = Gauge("aieng_kv_cache_bytes", h["aieng_kv_cache_bytes"], registry=r)
        self.prefix_queries = Counter("aieng_prefix_cache_queries", h["aieng_prefix_cache_queries_total"], registry=r)
        self.prefix_hits = Counter("aieng_prefix_cache_hits", h["aieng_prefix_cache_hits_total"], registry=r)
        self.prefix_hit_rate = Gauge("aieng_prefix_cache_hit_rate", h["aieng_prefix_cache_hit_rate"], registry=r)
        self._prefix_counts = (0, 0)  # (queried, hit) tokens: the counters' values, readable
        self._prefix_lock = threading.Lock()
        self.prefix_hit_rate.set_function(self._prefix_hit_rate)
        self.prefix_blocks = Gauge("aieng_prefix_cache_blocks", h["aieng_prefix_cache_blocks"], registry=r)
        self.prefix_bytes = Gauge("aieng_prefix_cache_bytes", h["aieng_prefix_cache_bytes"], registry=r)
        self.rss = Gauge("aieng_process_resident_memory_bytes", h["aieng_process_resident_memory_bytes"], registry=r)
        self.rss.set_function(_rss_bytes)
        self.bundle_info = Gauge("aieng_bundle_info", h["aieng_bundle_info"], ["bundle_id"], registry=r)
        self.config_valid = Gauge("aieng_config_valid", h["aieng_config_valid"], ["path"], registry=r)
        # What a server following a pointer says of it (set_deployment, set_rollback).
        self.mismatch = Gauge(
            "aieng_deployment_mismatch", h["aieng_deployment_mismatch"],
            ["pointer", "pointer_bundle", "served_bundle"], registry=r,
        )  # fmt: skip
        self.rollback_ready = Gauge(
            "aieng_rollback_target_ready", h["aieng_rollback_target_ready"], ["pointer", "bundle_id"], registry=r
        )
        self.rollback_stale = Gauge(
            "aieng_rollback_check_stale", h["aieng_rollback_check_stale"], ["pointer"], registry=r
        )
        self.rollback_age = Gauge(
            "aieng_rollback_check_age_seconds", h["aieng_rollback_check_age_seconds"], ["pointer"], registry=r
        )

    def observe_threads(self, governor: Any) -> None:
        """The engine's thread count and what other processes take (a cpu.governor.ThreadGovernor),
        and the counts of what must not happen after ready, read on each scrape."""
        from aieng_core.serving.kv_cache import allocations

        h, r = METRIC_HELP, self.registry
        Gauge("aieng_engine_threads", h["aieng_engine_threads"], registry=r).set_function(
            lambda: governor.now().threads
        )
        Gauge("aieng_cpu_other_processes_cores", h["aieng_cpu_other_processes_cores"], registry=r).set_function(
            lambda: governor.now().others_cores
        )
        Gauge("aieng_compiled_graphs", h["aieng_compiled_graphs"], registry=r).set_function(_compiled_graphs)
        Gauge("aieng_kv_cache_allocations", h["aieng_kv_cache_allocations"], registry=r).set_function(allocations)

    def set_bundle(self, bundle_id: str | None) -> None:
        """The bundle served now (None: none, after a deployment pointer was emptied)."""
        self.bundle_info.clear()
        if bundle_id is not None:
            self.bundle_info.labels(bundle_id=bundle_id).set(1)
            self.export_bundle(bundle_id)

    def export_bundle(self, bundle_id: str) -> None:
        """The request series of `bundle_id` at zero, from the moment it serves (a rate or a
        quantile over a series that does not exist yet is no answer at all)."""
        self.export_rejections(bundle_id)
        for histogram in (self.ttft, self.itl, self.e2e, self.queue_time):
            histogram.labels(bundle_id=bundle_id)
        self.prompt_tokens.labels(bundle_id=bundle_id)
        self.generation_tokens.labels(bundle_id=bundle_id)

    def export_rejections(self, bundle_id: str) -> None:
        """Zeros for every rejection reason of `bundle_id`."""
        for reason in REJECT_REASONS:
            self.rejected.labels(reason=reason, bundle_id=bundle_id)

    def set_config(self, path: str, valid: bool) -> None:
        """Whether the config file at `path` loads (config_watch.py)."""
        self.config_valid.labels(path=path).set(1 if valid else 0)

    def set_deployment(self, pointer: str, pointer_bundle: str, served_bundle: str, mismatch: bool) -> None:
        """One series for the pointer followed: 1 on a refused bundle, else 0 (an alert on
        `== 1` resolves when it goes to 0, never on a series that vanished)."""
        self.mismatch.clear()
        self.mismatch.labels(pointer=pointer, pointer_bundle=pointer_bundle, served_bundle=served_bundle).set(
            1 if mismatch else 0
        )

    def set_rollback(self, pointer: str, readiness: Any, now: float) -> None:
        """The last rollback readiness check of `pointer` (a deployment_watch.RollbackReadiness;
        None: no series)."""
        self.rollback_ready.clear()
        self.rollback_stale.clear()
        self.rollback_age.clear()
        if readiness is None:
            return
        if readiness.ready is not None:
            self.rollback_ready.labels(pointer=pointer, bundle_id=readiness.bundle_id).set(1 if readiness.ready else 0)
        # Stale is said also when no check ever ran (checked_at None): a rollback target nobody
        # checked is the case the overdue alert is for.
        self.rollback_stale.labels(pointer=pointer).set(1 if readiness.stale else 0)
        if readiness.checked_at is not None:
            self.rollback_age.labels(pointer=pointer).set(readiness.age_seconds(now))

    def observe_engine(self, stats: Any) -> None:
        """Copy an EngineStats snapshot (num_running, num_waiting, free_slots, max_batch,
        kv_cache_bytes) into the gauges; called on every scrape."""
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_free_slots.set(stats.free_slots)
        self.kv_slots.set(stats.max_batch)
        self.kv_bytes.set(stats.kv_cache_bytes)
        self.prefix_blocks.set(stats.prefix_cache_blocks)
        self.prefix_bytes.set(stats.prefix_cache_bytes)

    def observe_step(self, step: Any) -> None:
        """A StepStats of the engine thread: its batch and its prefix-cache lookups."""
        if step.batch_size > 0:
            self.batch_size.observe(step.batch_size)
        if step.prefix_queried_tokens:
            self.prefix_queries.inc(step.prefix_queried_tokens)
            self.prefix_hits.inc(step.prefix_hit_tokens)
            with self._prefix_lock:  # two engine threads step at once while a replica swaps
                self._prefix_counts = (
                    self._prefix_counts[0] + step.prefix_queried_tokens,
                    self._prefix_counts[1] + step.prefix_hit_tokens,
                )

    def _prefix_hit_rate(self) -> float:
        queried, hit = self._prefix_counts  # one tuple, so a scrape never reads half an update
        return hit / queried if queried else 0.0

    def observe_finished(
        self,
        finish_reason: str,
        prompt_tokens: int,
        e2e_seconds: float | None,
        bundle_id: str = NO_BUNDLE,
    ) -> None:
        self.success.labels(finished_reason=finish_reason, bundle_id=bundle_id).inc()
        self.prompt_tokens.labels(bundle_id=bundle_id).inc(prompt_tokens)
        if e2e_seconds is not None:
            self.e2e.labels(bundle_id=bundle_id).observe(e2e_seconds)

    def count_http(self, endpoint: str, status: int, bundle_id: str = NO_BUNDLE) -> None:
        self.http_requests.labels(endpoint=endpoint, status=str(status), bundle_id=bundle_id).inc()

    def reject(self, reason: str, bundle_id: str = NO_BUNDLE) -> None:
        self.rejected.labels(reason=reason, bundle_id=bundle_id).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTracker:
    """Per-request metrics fed from the engine thread, one RequestOutput at a time: TTFT and
    queue time once, one inter-token latency per new token, and the finish."""

    def __init__(self, metrics: ServingMetrics, clock: Any, bundle_id: str, counts_prompt: bool = True) -> None:
        self._metrics = metrics
        self._clock = clock
        self._bundle_id = bundle_id
        # The series of the bundle that answers, bound once: the engine thread feeds them per token.
        self._generation_tokens = metrics.generation_tokens.labels(bundle_id=bundle_id)
        self._itl = metrics.itl.labels(bundle_id=bundle_id)
        self._queue_time = metrics.queue_time.labels(bundle_id=bundle_id)
        self._ttft = metrics.ttft.labels(bundle_id=bundle_id)
        # False for the samples of a prompt after its first (n): the prompt is counted once.
        self._counts_prompt = counts_prompt
        self._last_token_time: float | None = None
        self._ttft_seen = False
        self._queue_seen = False

    def on_output(self, output: Any) -> None:
        now = self._clock()
        new_tokens = len(output.new_token_ids)
        if new_tokens:
            self._generation_tokens.inc(new_tokens)
            if self._last_token_time is not None:
                # A step yields one token per request; should it yield several, spread the gap.
                gap = (now - self._last_token_time) / new_tokens
                for _ in range(new_tokens):
                    self._itl.observe(gap)
            self._last_token_time = now
        if not self._queue_seen and output.queue_seconds is not None:
            self._queue_seen = True
            self._queue_time.observe(output.queue_seconds)
        if not self._ttft_seen and output.ttft_seconds is not None:
            self._ttft_seen = True
            self._ttft.observe(output.ttft_seconds)
        if output.finished:
            prompt_tokens = output.prompt_tokens if self._counts_prompt else 0
            reason = output.finish_reason or "error"
            self._metrics.observe_finished(reason, prompt_tokens, output.e2e_seconds, self._bundle_id)
