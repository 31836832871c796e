"""`aieng serve`: the HTTP app under uvicorn, with a graceful drain on SIGTERM.

uvicorn's own handling of SIGTERM stops at once (and re-raises the signal after shutdown,
so the process dies by it). Ours: the first SIGTERM or SIGINT turns readiness to 503; new
generation requests are still served for serving.shutdown_delay_s (default 0), the time a
load balancer needs to see the replica unready and stop sending it traffic, and refused
after it; the server keeps running until the requests in flight have finished or
drain_timeout_s more has passed, then shuts down and exits 0. A second signal stops waiting.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from aieng_core.config import AiengConfig
from aieng_core.serving.http.logs import configure_logging
from aieng_core.store.pointers import PRODUCTION
from aieng_core.store.request_log import RequestLog

log = logging.getLogger("aieng.serving.server")

ADMIN_TOKEN_ENV = "AIENG_ADMIN_TOKEN"
# After the drain, how long uvicorn may wait for connections to close before cancelling them.
SHUTDOWN_GRACE_S = 5


class DrainingServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, state: Any, drain_timeout_s: float, shutdown_delay_s: float = 0.0
    ) -> None:
        super().__init__(config)
        self.state = state  # state.ServingState
        self.drain_timeout_s = drain_timeout_s
        self.shutdown_delay_s = shutdown_delay_s
        self.drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown and the
        # process would die by the signal instead of exiting 0.
        if self.drain_deadline is None:
            self.state.begin_drain(self.shutdown_delay_s)
            self.drain_deadline = self.state.refusing_from + self.drain_timeout_s
            log.info(
                "%s received: draining for up to %g s",
                signal.Signals(sig).name,
                self.shutdown_delay_s + self.drain_timeout_s,
                extra={"in_flight": self.state.in_flight},
            )
        else:
            log.warning("second %s: stopping without waiting for requests in flight", signal.Signals(sig).name)
            self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.state.failed:
            self.should_exit = True
        elif self.drain_deadline is not None and not self.should_exit and self.state.refusing:
            # (during the shutdown delay, new requests still come: nothing to wait for yet)
            if self.state.in_flight == 0:
                log.info("drained: no request in flight; shutting down")
                self.should_exit = True
            elif time.monotonic() >= self.drain_deadline:
                log.warning(
                    "drain_timeout_s (%g s) passed with requests in flight; shutting down",
                    self.drain_timeout_s,
                    extra={"in_flight": self.state.in_flight},
                )
                self.should_exit = True
        return await super().on_tick(counter)


def open_request_log(path: Path | None, given: bool) -> RequestLog | None:
    """The request log at `path` (None: none). A file that cannot be opened is a ValueError
    naming it when the operator asked for it; the default one is warned about, not fatal."""
    if path is None:
        return None
    try:
        return RequestLog(path)
    except OSError as exc:
        message = f"cannot open the request log {path}: {exc.strerror or exc}"
        if given:
            raise ValueError(f"--request-log: {message}") from None
        log.warning("%s; serving without a request log (--request-log PATH sets another file)", message)
        return None


def run_server(
    bundle_path: Path | None,
    host: str,
    port: int,
    config: AiengConfig,
    log_level: str = "info",
    follow_home: Path | None = None,
    pointer: str = PRODUCTION,
    request_log: Path | None = None,
    request_log_given: bool = False,
    config_path: Path | None = None,
) -> int:
    """Serve the bundle (or follow `pointer` under `follow_home`) until drained; 0 after a
    clean drain, 1 when the bundle cannot be served. With `request_log`, one JSON record per
    answered request is appended to that file (store/request_log.py); a log file that cannot
    be opened stops the server when it was asked for (`request_log_given`), and is only
    warned about when it is the default. `config_path`, the file `config` was read from, is
    re-validated on every scrape of /metrics (aieng_config_valid)."""
    from aieng_core.serving.http.app import create_app
    from aieng_core.serving.http.tracing import from_environment

    configure_logging(log_level)
    requests = open_request_log(request_log, request_log_given)
    tracing = from_environment()  # None unless OTEL_* asks for traces
    admin_token = os.environ.get(ADMIN_TOKEN_ENV) or None
    follow = None
    if follow_home is not None:
        from aieng_core.serving.http.following import read_target

        home = Path(follow_home)
        follow = functools.partial(read_target, home, pointer)
    app = create_app(
        Path(bundle_path) if bundle_path is not None else None,
        config,
        admin_token,
        follow,
        request_log=requests,
        config_path=config_path,
        tracing=tracing,
    )
    state = app.state.serving
    log.info(
        "engine thread counts: %s; %s",
        " or ".join(map(str, state.threads.ladder)),
        "fewer while other processes take cores (serving.adapt_threads)"
        if state.threads.adapts
        else "fixed (serving.adapt_threads is off or there is one)",
    )
    serving_what = str(bundle_path) if bundle_path is not None else f"the {pointer} deployment under {follow_home}"
    log.info(
        "serving %s on http://%s:%d (admin API %s; request log %s)",
        serving_what,
        host,
        port,
        "enabled" if admin_token else f"disabled: {ADMIN_TOKEN_ENV} is not set",
        requests.path if requests is not None else "off",
        extra={"bundle_path": serving_what, "host": host, "port": port},
    )
    uv_config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,  # our JSON lines (logs.configure_logging) for uvicorn's loggers too
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        server_header=False,
    )
    server = DrainingServer(uv_config, state, config.serving.drain_timeout_s, config.serving.shutdown_delay_s)
    server.run()
    if state.failed:
        log.error("exiting: the bundle could not be served: %s", state.error)
        return 1
    return 0
