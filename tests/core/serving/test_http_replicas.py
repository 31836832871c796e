"""The HTTP app in this process, under a real uvicorn on loopback, with real tiny bundles:
which replica a request runs on decides everything about it, and an engine that dies under a
request is answered as readiness answers.

A swap or a death at the worst moment is made certain, not waited for: the state's acquire
is wrapped so the event happens exactly between a request arriving and its replica being taken.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from aieng_core.bundle.serving_bundle import build_serving_bundle
from aieng_core.loadgen.http_client import Reply, request
from aieng_core.loadgen.server_process import free_port
from aieng_core.serving.http import state as state_module
from aieng_core.serving.http.app import create_app
from aieng_core.serving.http.replica import Replica, in_a_thread_of_its_own, open_replica
from aieng_core.serving.http.state import ServingState
from tests.bundle_fixtures import BundledHome

READY_TIMEOUT_S = 60.0


@dataclass
class InProcessServer:
    port: int
    state: ServingState

    def post(self, path: str, body: dict) -> Reply:
        return request(self.port, "POST", path, body, timeout=30)

    def get(self, path: str) -> Reply:
        return request(self.port, "GET", path, timeout=30)


@pytest.fixture
def serve(serving_bundle_artifact: BundledHome) -> Iterator[Callable[[Path], InProcessServer]]:
    """Start create_app on a bundle under uvicorn in a thread; stopped at the end of the test."""
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(bundle_path: Path) -> InProcessServer:
        app = create_app(bundle_path, serving_bundle_artifact.config, admin_token=None)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
        thread = threading.Thread(target=server.run, name="uvicorn-under-test", daemon=True)
        thread.start()
        running.append((server, thread))
        started = InProcessServer(port, app.state.serving)
        ready = threading.Event()
        while not ready.wait(0.02):
            try:
                if started.get("/health/ready").status == 200:
                    ready.set()
            except OSError:
                pass  # not listening yet
            if not thread.is_alive():
                raise AssertionError("uvicorn exited before the app was ready")
        return started

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(READY_TIMEOUT_S)


@pytest.fixture(scope="module")
def other_defaults(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model bundled with default_max_new_tokens 5 (the tiny config says 16)."""
    import shutil

    from aieng_core.store import ArtifactStore

    home = tmp_path_factory.mktemp("other-defaults") / "home"
    shutil.copytree(serving_bundle_artifact.home, home)
    config = serving_bundle_artifact.config
    recipe = config.bundle.model_copy(update={"default_max_new_tokens": 5})
    bundle = build_serving_bundle(ArtifactStore(home), config.model_copy(update={"bundle": recipe}))
    assert bundle.id != serving_bundle_artifact.bundle.id
    return bundle.path


@pytest.fixture(scope="module")
def no_chat_template(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model bundled with bundle.chat_template null."""
    import shutil

    from aieng_core.store import ArtifactStore

    home = tmp_path_factory.mktemp("no-chat-template") / "home"
    shutil.copytree(serving_bundle_artifact.home, home)
    config = serving_bundle_artifact.config
    recipe = config.bundle.model_copy(update={"chat_template": None})
    bundle = build_serving_bundle(ArtifactStore(home), config.model_copy(update={"bundle": recipe}))
    assert bundle.metrics["chat_template_sha256"] is None and bundle.metrics["golden_conversations"] == 0
    return bundle.path


def test_a_bundle_without_a_chat_template_answers_chat_with_a_400_saying_so(serve, no_chat_template: Path) -> None:
    server = serve(no_chat_template)
    reply = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert (reply.status, reply.error_code, reply.error["param"]) == (400, "no_chat_template", "messages")
    assert "has no chat template" in reply.error["message"]
    assert server.state.in_flight == 0  # the lease was given back
    # Completions still answer.
    assert server.post("/v1/completions", {"prompt": "The data", "max_tokens": 2}).status == 200


def swap_when_acquired(state: ServingState, monkeypatch: pytest.MonkeyPatch, replica: Replica) -> None:
    """The next acquire() finds `replica` installed: a reload completed just as a request came in."""
    acquire = state.acquire

    def swapped(request_id: str | None = None) -> Replica:
        monkeypatch.setattr(state, "acquire", acquire)
        state._install(replica)
        return acquire(request_id)

    monkeypatch.setattr(state, "acquire", swapped)


@pytest.mark.parametrize(
    ("path", "body", "tokens_of"),
    [
        ("/generate", {"prompt": "The data pipeline", "ignore_eos": True}, lambda answer: [answer["tokens"]]),
        (
            "/predict",
            {"inputs": ["The data", "A model"], "options": {"ignore_eos": True}},
            lambda answer: [output["tokens"] for output in answer["outputs"]],
        ),
    ],
    ids=["generate", "predict"],
)
def test_a_request_takes_its_defaults_from_the_replica_it_runs_on(
    serve, serving_bundle_artifact: BundledHome, other_defaults: Path, monkeypatch, path, body, tokens_of
) -> None:
    server = serve(serving_bundle_artifact.bundle.path)  # default_max_new_tokens 16
    assert set(tokens_of(server.post(path, body).json)) == {16}
    replica = open_replica(other_defaults, serving_bundle_artifact.config, server.state._on_step, server.state.threads)
    swap_when_acquired(server.state, monkeypatch, replica)
    reply = server.post(path, body)
    assert reply.status == 200, reply.body
    # The bundle that answered is the new one, and so are the defaults it answered with.
    assert server.state.current is replica
    assert set(tokens_of(reply.json)) == {5}


def test_an_engine_that_dies_under_a_request_is_a_503_as_readiness_says(
    serve, serving_bundle_artifact: BundledHome, monkeypatch
) -> None:
    server = serve(serving_bundle_artifact.bundle.path)
    state = server.state
    acquire = state.acquire

    def dies_after_acquiring(request_id: str | None = None) -> Replica:
        replica = acquire(request_id)
        replica.loop.stop()  # the loop is gone before the request reaches it
        return replica

    monkeypatch.setattr(state, "acquire", dies_after_acquiring)
    reply = server.post("/generate", {"prompt": "The data pipeline", "max_new_tokens": 4})
    assert (reply.status, reply.error_code) == (503, "engine_failed"), reply.body
    ready = server.get("/health/ready")
    assert (ready.status, ready.error_code) == (503, "engine_failed")
    assert reply.error["message"] == ready.error["message"] == "the engine loop stopped after an error"
    # And every request after it, through the same one answer.
    monkeypatch.setattr(state, "acquire", acquire)
    for path, body in (("/generate", {"prompt": "x"}), ("/v1/completions", {"prompt": "x", "max_tokens": 2})):
        again = server.post(path, body)
        assert (again.status, again.error_code) == (503, "engine_failed"), (path, again.body)


def test_a_replica_is_loaded_in_a_thread_that_ends_with_the_load(
    serve, serving_bundle_artifact: BundledHome, monkeypatch
) -> None:
    """Loading runs torch (weights, goldens, warmup), so the thread that loads keeps OpenMP
    workers while it lives; it must end, leaving the engine thread's the only ones
    (in_a_thread_of_its_own says why)."""
    loaders: list[threading.Thread] = []

    def recording_open(*args, **kwargs) -> Replica:
        loaders.append(threading.current_thread())
        return open_replica(*args, **kwargs)

    monkeypatch.setattr(state_module, "open_replica", recording_open)
    server = serve(serving_bundle_artifact.bundle.path)
    assert server.post("/generate", {"prompt": "The data pipeline", "max_new_tokens": 2}).status == 200
    [loader] = loaders
    loader.join(10)
    assert not loader.is_alive()
    assert loader.name == "aieng-load"
    engine_thread = server.state.current.loop._thread
    assert engine_thread.is_alive() and engine_thread is not loader


def test_work_in_a_thread_of_its_own_returns_its_result_or_raises_its_error() -> None:
    import asyncio

    ran_in: list[threading.Thread] = []

    def work() -> int:
        ran_in.append(threading.current_thread())
        return 7

    def fails() -> int:
        raise ValueError("bundle refused")

    async def both() -> tuple[int, str]:
        result = await in_a_thread_of_its_own(work, "aieng-load")
        try:
            await in_a_thread_of_its_own(fails, "aieng-load")
        except ValueError as exc:
            return result, str(exc)
        raise AssertionError("the error was not raised")

    assert asyncio.run(both()) == (7, "bundle refused")
    ran_in[0].join(10)
    assert ran_in[0] is not threading.main_thread() and not ran_in[0].is_alive()


def test_a_result_nobody_awaits_any_more_is_discarded() -> None:
    """A load finishing after its awaiting task was cancelled (a shutdown mid-load) hands its
    replica to `discard`, which stops it, instead of leaking a running engine."""
    import asyncio

    release, discarded = threading.Event(), threading.Event()
    seen: list[object] = []

    def slow_load() -> str:
        release.wait(10)
        return "replica"

    def discard(result: object) -> None:
        seen.append(result)
        discarded.set()

    async def cancel_mid_load() -> None:
        task = asyncio.ensure_future(in_a_thread_of_its_own(slow_load, "aieng-load", discard))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await asyncio.get_running_loop().run_in_executor(None, discarded.wait, 10)

    asyncio.run(cancel_mid_load())
    assert seen == ["replica"]


def test_the_server_answers_before_the_engine_is_imported() -> None:
    """/health/live answers at once: importing the HTTP app loads no torch (the engine is
    imported where it runs, off the event loop)."""
    import subprocess
    import sys

    code = (
        "import sys, aieng_core.serving.http.app\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
