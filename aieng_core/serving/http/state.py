"""What the server is doing: loading, ready or failed, draining; which replica serves; how
many requests hold one (leases).

Lifecycle: /health/live answers at once; the bundle is loaded, verified, warmed up and given
a one-token forward in a background thread (replica.py), and only then does /health/ready
turn 200. begin_drain() (the server calls it on SIGTERM) turns readiness to 503 at once and,
after serving.shutdown_delay_s (the time a load balancer needs to take the replica out of
rotation), refuses new generation requests while those in flight finish. A reload installs the next replica
beside the current one: new requests get the new one, in-flight ones finish on the old one,
whose loop is stopped once the last of them lets go.

Why the server cannot take a request is decided in one place, `unavailable()`: readiness
answers with it, and so does every generation request refused for it, so the two always agree,
but for the shutdown delay, when readiness already says draining (`not_ready()`) and requests
are still taken.

Following a pointer, what the pointer names and what is served may differ: while a new
bundle loads (seconds), and when the server refused the bundle the pointer names (it keeps
serving the one it had: dropping traffic would be worse). The second is a mismatch
(`mismatch()`): /health/ready and /version carry it, and so does aieng_deployment_mismatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request as HttpRequest

from aieng_core.config import AiengConfig
from aieng_core.serving.http.errors import ApiError, unavailable
from aieng_core.serving.http.metrics import ServingMetrics
from aieng_core.serving.http.replica import Replica, in_a_thread_of_its_own, open_replica, server_governor
from aieng_core.store import ArtifactIntegrityError
from aieng_core.store.canary_state import routes_to_canary
from aieng_core.store.request_log import NO_BUNDLE

if TYPE_CHECKING:
    from aieng_core.serving.engine import EngineStats, StepStats
    from aieng_core.serving.http.config_watch import ConfigWatch
    from aieng_core.serving.http.deployment_watch import RollbackReadiness
    from aieng_core.serving.http.following import PointerTarget
    from aieng_core.serving.http.tracing import Tracing
    from aieng_core.store.request_log import RequestLog

log = logging.getLogger("aieng.serving.http")

# Why a bundle cannot be served, said in one line: no traceback in the log for these.
BUNDLE_ERRORS = (ArtifactIntegrityError, OSError, ValueError)


class ServingState:
    """`follow`, when given, reads the deployment pointer the server follows; the bundle
    served is then whatever the pointer names (following.py keeps it so)."""

    def __init__(
        self,
        bundle_path: Path | None,
        config: AiengConfig,
        admin_token: str | None,
        follow: Callable[[], PointerTarget] | None = None,
    ) -> None:
        if (bundle_path is None) == (follow is None):
            raise ValueError("serve either a bundle path or a deployment pointer, not both and not neither")
        self.bundle_path = bundle_path
        self.follow = follow
        self.following: PointerTarget | None = None  # the target last acted on (loaded, emptied or refused)
        self.refused_at: float | None = None  # when `following` was refused (it is retried later)
        self.refusal: str | None = None  # why it was refused
        self.rollback: RollbackReadiness | None = None  # the pointer's last rollback check, read on each poll
        self.request_log: RequestLog | None = None  # one record per answered request (middleware.py)
        self.config_watch: ConfigWatch | None = None  # the config file's validity, re-read on each scrape
        self.tracing: Tracing | None = None  # OpenTelemetry spans of each request (tracing.py); None: off
        self.config = config
        self.admin_token = admin_token or None
        # One for every replica's engine loop: the threads the steps run with (cpu/governor.py).
        self.threads = server_governor(config)
        self.metrics = ServingMetrics()
        self.metrics.observe_threads(self.threads)
        self.metrics.ready.set_function(lambda: float(self.ready))
        self.metrics.max_waiting.set(config.serving.max_waiting)
        self.phase = "loading"  # loading -> ready | failed
        self.error: str | None = None
        self.current: Replica | None = None
        # A canary rollout (deploy/canary.py): the candidate's replica beside `current`, and the
        # share of generation requests it answers, chosen by request id.
        self.canary: Replica | None = None
        self.canary_share = 0.0
        self.canary_refused: tuple[str, float, str] | None = None  # (bundle id, when, why)
        self.canary_target: Any = None  # following.CanaryTarget the pointer names now, or None
        self.canary_loading: asyncio.Task[None] | None = None  # the candidate being loaded
        # Set on the first SIGTERM (begin_drain): time.monotonic() from which new requests get 503.
        self.refusing_from: float | None = None
        self.in_flight = 0
        self.reload_lock: asyncio.Lock | None = None  # made in the server's event loop
        self._background: set[asyncio.Task[Any]] = set()
        self._replicas: list[Replica] = []

    # ---- what the server can do now ----------------------------------------------------------
    @property
    def ready(self) -> bool:
        """/health/ready answers 200."""
        return self.not_ready() is None

    @property
    def failed(self) -> bool:
        return self.phase == "failed"

    @property
    def draining(self) -> bool:
        """From the first SIGTERM on: readiness 503, the pointer no longer followed."""
        return self.refusing_from is not None

    @property
    def refusing(self) -> bool:
        """Draining and past the shutdown delay: new generation requests are refused."""
        return self.refusing_from is not None and time.monotonic() >= self.refusing_from

    def not_ready(self) -> ApiError | None:
        """What /health/ready answers (None: 200): why a request would be refused, and from
        the first SIGTERM on, draining, while the shutdown delay still serves requests."""
        if self.draining and not self.refusing:
            return unavailable(
                "draining: the server is shutting down and takes no new traffic shortly; use another replica",
                "draining",
            )
        return self.unavailable()

    def unavailable(self) -> ApiError | None:
        """Why no generation request can be taken now (a 503), or None when one can."""
        if self.refusing:
            return unavailable("draining: the server is shutting down; retry on another replica", "draining")
        if self.failed:
            return unavailable(f"the bundle could not be loaded: {self.error}", "load_failed")
        if self.phase == "loading":
            return unavailable("loading: the bundle is being loaded and warmed up", "loading")
        if self.current is None:
            return unavailable(self.no_bundle_message(), "no_deployment")
        if not self.current.loop.running:
            # A loop that died fails its own requests; the load balancer must move on.
            return unavailable("the engine loop stopped after an error", "engine_failed")
        return None

    def no_bundle_message(self) -> str:
        from aieng_core.store.pointers import PRODUCTION

        pointer = self.following.pointer if self.following is not None else PRODUCTION
        return f"no bundle is deployed on the {pointer} pointer; promote one with `aieng deploy promote BUNDLE_ID`"

    def deployment_info(self) -> dict[str, Any] | None:
        """The pointer this server follows, what it names, and whether that was refused."""
        following = self.following
        if following is None:
            return None
        return {
            "pointer": following.pointer,
            "bundle_id": following.bundle_id,
            "sequence": following.sequence,
            "refused": self.refused_at is not None,
            "mismatch": self.mismatch(),
            "canary": self.canary_info(),
        }

    def canary_info(self) -> dict[str, Any] | None:
        """The canary this server routes to (`bundle_id`, `share`), or the one it refused; None: none."""
        if self.canary is not None:
            return {"bundle_id": self.canary.bundle_id, "share": self.canary_share, "refused": None}
        if self.canary_refused is not None:
            return {"bundle_id": self.canary_refused[0], "share": 0.0, "refused": self.canary_refused[2]}
        return None

    def mismatch(self) -> dict[str, Any] | None:
        """`{pointer_bundle, served_bundle, reason}` while the pointer names a bundle this
        server refused and it serves another (or none); None while they agree or one loads."""
        following = self.following
        if following is None or self.refused_at is None:
            return None
        served = self.current.bundle_id if self.current is not None else None
        if following.bundle_id == served:
            return None
        return {"pointer_bundle": following.bundle_id, "served_bundle": served, "reason": self.refusal}

    def observe_deployment(self, now: float) -> None:
        """Copy the pointer followed (mismatch, rollback readiness) into the gauges; called
        on every scrape. A server serving a bundle path exports none of them."""
        following = self.following
        if following is None:
            return
        served = self.current.bundle_id if self.current is not None else None
        self.metrics.set_deployment(
            following.pointer,
            following.bundle_id or NO_BUNDLE,
            served or NO_BUNDLE,
            self.mismatch() is not None,
        )
        self.metrics.set_rollback(following.pointer, self.rollback, now)

    def observe_config(self) -> None:
        """Whether the config file the server started with still loads (config_watch.py);
        called on every scrape. Without a watch (an app made without its config's path), no
        series."""
        if self.config_watch is not None:
            self.metrics.set_config(str(self.config_watch.path), self.config_watch.problem() is None)

    def begin_drain(self, shutdown_delay_s: float = 0.0) -> None:
        """Readiness 503 now; new requests refused after `shutdown_delay_s`."""
        if not self.draining:
            self.refusing_from = time.monotonic() + shutdown_delay_s
            if shutdown_delay_s > 0:
                log.info(
                    "draining: readiness is 503; new requests are served %g s more (serving.shutdown_delay_s), "
                    "then refused",
                    shutdown_delay_s,
                    extra={"in_flight": self.in_flight},
                )
            else:
                log.info("draining: readiness is 503, new requests are refused", extra={"in_flight": self.in_flight})

    # ---- loading and swapping ----------------------------------------------------------------
    def _on_step(self, step: StepStats, _engine_stats: EngineStats) -> None:
        self.metrics.observe_step(step)

    async def open_replica(self, path: Path) -> Replica:
        """A new replica of the bundle at `path`, loaded off the event loop; not yet serving."""
        return await self._open(path)

    async def _open(self, path: Path) -> Replica:
        # Not asyncio.to_thread: see in_a_thread_of_its_own (the engine thread must be the
        # only one left holding OpenMP workers).
        return await in_a_thread_of_its_own(
            lambda: open_replica(path, self.config, self._on_step, self.threads),
            "aieng-load",
            discard=lambda r: r.stop(10.0),
        )

    async def initial_load(self) -> None:
        started = time.monotonic()
        try:
            if self.follow is not None:
                self.following = await asyncio.to_thread(self.follow)
                self.rollback = self.following.rollback
                self.bundle_path = self.following.path
                if self.bundle_path is None:
                    # Import the engine now (torch and the model code take seconds), so the
                    # first promote only loads, verifies and warms its bundle.
                    for module in (
                        "aieng_core.bundle.verify",
                        "aieng_core.serving.engine",
                        "aieng_core.model.hf_files",
                    ):
                        await asyncio.to_thread(importlib.import_module, module)
                    self.phase = "ready"  # and not ready(): nothing to serve until a promote
                    log.warning("%s", self.no_bundle_message())
                    return
            assert self.bundle_path is not None
            replica = await self._open(self.bundle_path)
        except Exception as exc:
            self.phase, self.error = "failed", str(exc)
            log.error("cannot serve bundle %s: %s", self.bundle_path, exc, exc_info=not isinstance(exc, BUNDLE_ERRORS))
            return
        self._install(replica)
        self.phase = "ready"
        stats = replica.loop.stats()
        log.info(
            "ready: bundle %s loaded, verified and warm",
            replica.bundle_id,
            extra={
                "bundle_id": replica.bundle_id,
                "bundle_path": str(self.bundle_path),
                "kv_cache_bytes": stats.kv_cache_bytes,
                "latency_ms": round((time.monotonic() - started) * 1000, 1),
                "timings": replica.warmup,
            },
        )

    async def reload(self, path: Path) -> tuple[Replica, Replica | None]:
        """Open the bundle at `path` and serve it; (the new replica, the one it replaced)."""
        replica = await self._open(path)
        self.bundle_path = path
        return replica, self._install(replica)

    def _install(self, replica: Replica) -> Replica | None:
        previous = self.current
        self.current = replica
        self._replicas.append(replica)
        self.metrics.set_bundle(replica.bundle_id)
        if previous is not None:
            self._retire(previous)
        return previous

    def install_canary(self, replica: Replica, share: float) -> None:
        """Route `share` of the generation requests to `replica` (a canary's candidate)."""
        previous, self.canary, self.canary_share = self.canary, replica, share
        self.canary_refused = None
        self._replicas.append(replica)
        self.metrics.export_bundle(replica.bundle_id)
        if previous is not None:
            self._retire(previous)

    def uninstall_canary(self) -> Replica | None:
        """Stop routing to the canary (rolled back, or ended): in-flight requests finish on it."""
        previous, self.canary, self.canary_share = self.canary, None, 0.0
        if previous is not None:
            self._retire(previous)
        return previous

    def adopt_canary(self) -> Replica | None:
        """The pointer now names the canary's bundle (promoted): its replica serves everything,
        with nothing to load; the one it replaces retires. Returns that one."""
        replica, self.canary, self.canary_share = self.canary, None, 0.0
        assert replica is not None
        previous, self.current = self.current, replica
        self.metrics.set_bundle(replica.bundle_id)
        if previous is not None:
            self._retire(previous)
        return previous

    def uninstall(self) -> Replica | None:
        """Serve nothing (a pointer rolled back to no bundle): in-flight requests finish on
        the retired engine; new ones get 503 until a bundle is promoted."""
        previous, self.current = self.current, None
        self.metrics.set_bundle(None)
        if previous is not None:
            self._retire(previous)
        return previous

    def _retire(self, replica: Replica) -> None:
        replica.retired = True
        self._maybe_stop(replica)

    def _maybe_stop(self, replica: Replica) -> None:
        if replica.retired and replica.active == 0:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(replica.stop, 10.0))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            with contextlib.suppress(ValueError):
                self._replicas.remove(replica)
            log.info("stopped the engine of retired bundle %s", replica.bundle_id)

    async def shutdown(self) -> None:
        if self.canary_loading is not None:
            self.canary_loading.cancel()
            await asyncio.gather(self.canary_loading, return_exceptions=True)
        if self.request_log is not None:
            self.request_log.close()
        for replica in list(self._replicas):
            await asyncio.to_thread(replica.stop, 10.0)
        self._replicas.clear()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # ---- leases: which replica a generation request uses ---------------------------------------
    def acquire(self, request_id: str | None = None) -> Replica:
        """The replica a new generation request holds until release(); a 503 saying why not
        (the same answer as readiness) when none can take it. During a canary rollout, the
        request goes to the candidate when its id hashes into the canary's share (sticky)."""
        refusal = self.unavailable()
        if refusal is not None:
            self.metrics.reject("draining" if refusal.code == "draining" else "not_ready")
            raise refusal
        replica = self.current
        assert replica is not None
        canary = self.canary
        if (
            canary is not None
            and request_id is not None
            and canary.loop.running
            and routes_to_canary(request_id, self.canary_share)
        ):
            replica = canary
        replica.active += 1
        self.in_flight += 1
        return replica

    def release(self, replica: Replica) -> None:
        replica.active -= 1
        self.in_flight -= 1
        self._maybe_stop(replica)


def serving_state(request: HttpRequest) -> ServingState:
    """The server's state, reached through the app (create_app puts it there): every route
    takes it as a dependency, as vLLM's routers take theirs from `app.state`."""
    state: ServingState = request.app.state.serving
    return state
