"""A replica: one loaded, verified, warmed bundle and the engine loop serving it.

The server holds one replica at a time (state.py); a reload or a pointer switch opens the
next one beside it, and the old one keeps its loop until the last request holding it ends.

A replica of a bundle in a store (artifacts/serving_bundle/<id>/) holds it in that store
(ArtifactStore.hold) from before it is loaded until its loop stops: `aieng store gc` never
deletes a bundle a server is serving, whether a pointer still names it or not.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from aieng_core.asset_keys import SERVING_BUNDLE
from aieng_core.config import AiengConfig
from aieng_core.cpu.governor import ThreadGovernor
from aieng_core.serving.device import resolve_device
from aieng_core.serving.http.api_models import RequestDefaults
from aieng_core.store import ArtifactIntegrityError, ArtifactNotFound
from aieng_core.store.lineage import bundle_data_version, bundle_store
from aieng_core.store.request_log import UNKNOWN_DATA_VERSION

if TYPE_CHECKING:  # torch: imported by open_replica, off the event loop, never to start the server
    from aieng_core.bundle.verify import LoadedBundle
    from aieng_core.serving.engine import EngineStats, StepStats
    from aieng_core.serving.engine_loop import EngineLoop

OnStep = Callable[["StepStats", "EngineStats"], None]
T = TypeVar("T")


@dataclass
class Replica:
    """One loaded bundle and the engine loop serving it."""

    bundle: LoadedBundle
    loop: EngineLoop
    defaults: RequestDefaults  # what a request leaves out is taken from here: the bundle's own
    warmup: dict[str, Any]
    # The content hash of the bundle's dataset_manifest (X-Aieng-Data-Version), read from the
    # store holding the bundle; "unknown" for a bundle outside a store, or one whose store
    # lost that manifest.
    data_version: str = UNKNOWN_DATA_VERSION
    loaded_at: float = field(default_factory=time.time)
    active: int = 0  # HTTP requests holding this replica
    retired: bool = False  # another replica serves new requests; stop once `active` is 0
    hold: ExitStack = field(default_factory=ExitStack)  # the bundle held in its store, until stop()

    @property
    def bundle_id(self) -> str:
        return str(self.bundle.bundle_id)

    @property
    def max_context(self) -> int:
        return int(self.bundle.serving["max_context"])

    def stop(self, timeout: float) -> None:
        """Stop the engine loop, then let go of the bundle (gc may take it once nothing reaches it)."""
        try:
            self.loop.stop(timeout)
        finally:
            self.hold.close()


def hold_bundle(bundle_path: Path) -> ExitStack:
    """The bundle at `bundle_path` held in the store holding it; nothing held for a bundle
    outside a store, or one not (any longer) in it: loading it then says what is missing."""
    held = ExitStack()
    store = bundle_store(bundle_path)
    if store is not None:
        try:
            held.enter_context(store.hold(store.get(SERVING_BUNDLE, Path(bundle_path).name)))
        except (ArtifactNotFound, ArtifactIntegrityError):
            pass
    return held


def open_replica(bundle_path: Path, config: AiengConfig, on_step: OnStep, threads: ThreadGovernor) -> Replica:
    """Load and verify a bundle, warm its engine up, prove a forward works, start its loop.

    Blocking (seconds): run it off the event loop. The bundle fixes the model, its limits of
    memory and context (max_batch, max_context, max_prefill_tokens) and the request defaults;
    the server's config fixes how it behaves under load (max_waiting, timeouts, threads). The
    engine is warmed up and its step graphs captured at every thread count of the server's
    governor (`threads.ladder`), whose count its loop then steps at."""
    import torch

    from aieng_core.bundle.verify import load_bundle
    from aieng_core.serving.engine_loop import EngineLoop

    serving = config.serving
    torch.set_num_threads(threads.ladder[0])  # loaded and warmed at the largest count (goldens at their own)
    with hold_bundle(bundle_path) as held:  # released here only if the replica is never opened
        bundle = load_bundle(bundle_path, device=resolve_device(serving.device))
        engine = bundle.make_engine(max_waiting=serving.max_waiting, serving=serving, thread_counts=threads.ladder)
        warmup = engine.prepare_to_serve(serving.warmup_prompt_lengths)
        defaults = RequestDefaults.of_bundle(bundle.serving)
        data_version = bundle_data_version(bundle_store(bundle_path), bundle.manifest) or UNKNOWN_DATA_VERSION
        threads.settle()  # the count the machine has room for now, before the first request
        loop = EngineLoop(engine, on_step=on_step, threads=threads).start()
        replica = Replica(bundle=bundle, loop=loop, defaults=defaults, warmup=warmup, data_version=data_version)
        replica.hold = held.pop_all()  # the replica holds the bundle now, until it stops
    return replica


def server_governor(config: AiengConfig) -> ThreadGovernor:
    """The server's thread governor: serving.threads (0: the cores this process has) halved down
    to 1, adapting to what other processes take when serving.adapt_threads."""
    from aieng_core.cpu.quota import read_cpu_quota
    from aieng_core.cpu.usage import CpuSampler

    quota = read_cpu_quota()
    ladder = config.serving.thread_counts(quota.cores)
    return ThreadGovernor(ladder, CpuSampler(quota.affinity) if config.serving.adapt_threads else None)


async def in_a_thread_of_its_own(work: Callable[[], T], name: str, discard: Callable[[T], object] | None = None) -> T:
    """`work()` in a new thread that ends with it, awaited from the event loop (in the caller's
    context, as asyncio.to_thread runs it: log lines keep their request id). `discard(result)`
    is called, off the event loop, on a result nobody takes any more (the awaiting task was
    cancelled, the loop closed): a replica loaded during a shutdown is stopped, not leaked.

    For loading a replica: its torch work (weights, the goldens, warmup and capture) runs
    OpenMP parallel regions, and each thread that runs one keeps a team of OpenMP workers for
    as long as it lives. libgomp counts them: with more of them than cores it stops spinning
    between parallel regions and puts its workers to sleep instead, and every op of the engine
    thread then pays a futex wake-up (measured on 2 cores: an elementwise op 18 -> 110 us, the
    batch-64 decode step 7 -> 11 ms). asyncio.to_thread's workers live on, with their team;
    a thread of its own takes its team with it when it ends, so the engine thread's is the
    only one left."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def abandon(result: T) -> None:
        if discard is not None:
            threading.Thread(target=discard, args=(result,), name=f"{name}-discard", daemon=True).start()

    def settle(result: T | None, error: BaseException | None) -> None:  # the event loop
        if done.cancelled():
            if error is None:
                abandon(result)  # type: ignore[arg-type]
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        result, error = None, None
        try:
            result = context.run(work)
        except BaseException as exc:  # handed to the awaiting task, as asyncio.to_thread does
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # a closed loop: nobody awaits any more
            if error is None:
                abandon(result)  # type: ignore[arg-type]

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        return await done
    except asyncio.CancelledError:
        # Cancelled after the result was set but before this task resumed: nobody takes it.
        if done.done() and not done.cancelled() and done.exception() is None:
            abandon(done.result())
        raise
