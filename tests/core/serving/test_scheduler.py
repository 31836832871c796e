"""Scheduler: FCFS admission under the slot and prefill-token limits, decode never starved,
cancellation and finishing free slots at once. No model: only the pool's bookkeeping."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aieng_core.serving.kv_cache import KVCachePool
from aieng_core.serving.request import Request, RequestStatus, SamplingParams
from aieng_core.serving.scheduler import QueueFull, Scheduler

MAX_BATCH = 4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_pool() -> KVCachePool:
    return KVCachePool(num_layers=1, max_batch=MAX_BATCH, num_kv_heads=1, max_context=16, head_dim=2)


def make_scheduler(
    max_waiting: int = 16, max_prefill_tokens: int = 64, clock: Clock | None = None
) -> tuple[Scheduler, KVCachePool]:
    pool = make_pool()
    return Scheduler(pool, max_waiting, max_prefill_tokens, clock=clock or Clock()), pool


def req(request_id: str, prompt_len: int = 3) -> Request:
    return Request(request_id, list(range(1, prompt_len + 1)), SamplingParams(max_new_tokens=4))


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def step_tokens(plan) -> None:
    """What the model runner would do: one new token for every decoding request and every
    request whose prefill chunk ends its prompt."""
    for request in (*plan.prefill, *plan.decode):
        if request in plan.decode or request.prefill_completes:
            request.output_ids.append(7)


def chunks(plan) -> list[tuple[str, int, int]]:
    return [(r.request_id, *chunk) for r, chunk in zip(plan.prefill, plan.prefill_chunks, strict=True)]


def test_the_scheduler_module_does_not_import_torch() -> None:
    code = "import sys, aieng_core.serving.scheduler; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_admits_first_come_first_served_into_the_lowest_free_slots() -> None:
    scheduler, pool = make_scheduler()
    for name in ("a", "b", "c"):
        scheduler.add(req(name))
    assert (scheduler.num_waiting, scheduler.num_running, scheduler.has_work) == (3, 0, True)

    plan = scheduler.schedule()

    assert ids(plan.prefill) == ["a", "b", "c"]
    assert plan.decode == () and plan.finished == ()
    assert [r.slot for r in plan.prefill] == [0, 1, 2]
    assert [pool.owner(slot) for slot in range(MAX_BATCH)] == ["a", "b", "c", None]
    assert all(r.status is RequestStatus.RUNNING for r in plan.prefill)
    assert ids(scheduler.running) == ["a", "b", "c"]
    assert scheduler.waiting == ()
    assert pool.free_slots == 1


def test_admits_no_more_than_the_free_slots_and_the_rest_wait_in_order() -> None:
    scheduler, pool = make_scheduler()
    for i in range(6):
        scheduler.add(req(f"r{i}"))

    first = scheduler.schedule()
    step_tokens(first)
    second = scheduler.schedule()

    assert ids(first.prefill) == ["r0", "r1", "r2", "r3"]
    assert ids(scheduler.waiting) == ["r4", "r5"]
    assert pool.free_slots == 0
    assert second.prefill == ()
    assert ids(second.decode) == ["r0", "r1", "r2", "r3"]


def test_prefill_token_budget_limits_one_step_and_the_rest_join_the_next() -> None:
    scheduler, _ = make_scheduler(max_prefill_tokens=10)
    scheduler.add(req("a", prompt_len=4))
    scheduler.add(req("b", prompt_len=5))
    scheduler.add(req("c", prompt_len=3))  # 4 + 5 + 3 = 12 > 10: c gets the budget's last token

    first = scheduler.schedule()
    step_tokens(first)
    second = scheduler.schedule()

    assert chunks(first) == [("a", 0, 4), ("b", 0, 5), ("c", 0, 1)]
    assert chunks(second) == [("c", 1, 2)]  # the rest of c's prompt, before anything new
    assert ids(second.decode) == ["a", "b"]
    assert first.prefill[2].output_ids == []  # no token from a chunk that does not end its prompt


def test_a_prompt_longer_than_the_budget_is_prefilled_a_chunk_per_step_beside_the_decodes() -> None:
    scheduler, _ = make_scheduler(max_prefill_tokens=10)
    scheduler.add(req("short", prompt_len=2))
    first = scheduler.schedule()
    step_tokens(first)
    scheduler.add(req("long", prompt_len=25))
    scheduler.add(req("next", prompt_len=3))
    plans = []
    for _ in range(4):
        plans.append(scheduler.schedule())
        step_tokens(plans[-1])

    assert [chunks(p) for p in plans] == [
        [("long", 0, 10)],
        [("long", 10, 10)],
        [("long", 20, 5), ("next", 0, 3)],
        [],
    ]
    # The running stream decodes every step while the long prompt is prefilled.
    assert [ids(p.decode) for p in plans] == [["short"], ["short"], ["short"], ["short", "long", "next"]]


def test_fcfs_does_not_let_a_short_prompt_overtake_a_long_one() -> None:
    scheduler, _ = make_scheduler(max_prefill_tokens=10)
    scheduler.add(req("a", prompt_len=8))
    scheduler.add(req("long", prompt_len=5))
    scheduler.add(req("short", prompt_len=1))

    plan = scheduler.schedule()

    assert chunks(plan) == [("a", 0, 8), ("long", 0, 2)]  # the budget's rest goes to the next in line
    assert ids(scheduler.waiting) == ["short"]


def test_decode_runs_every_running_request_every_step_while_a_queue_waits() -> None:
    scheduler, _ = make_scheduler(max_prefill_tokens=3)
    scheduler.add(req("first", prompt_len=3))
    step_tokens(scheduler.schedule())
    for i in range(3):
        scheduler.add(req(f"w{i}", prompt_len=3))

    plans = []
    for _ in range(4):
        plan = scheduler.schedule()
        step_tokens(plan)
        plans.append(plan)

    assert [ids(p.prefill) for p in plans] == [["w0"], ["w1"], ["w2"], []]
    assert [ids(p.decode) for p in plans] == [
        ["first"],
        ["first", "w0"],
        ["first", "w0", "w1"],
        ["first", "w0", "w1", "w2"],
    ]
    # A newly admitted request prefills; it decodes only from the next step on.
    assert all(set(ids(p.prefill)).isdisjoint(ids(p.decode)) for p in plans)


def test_cancelled_waiting_and_running_requests_leave_at_the_next_schedule_and_free_every_slot() -> None:
    scheduler, pool = make_scheduler()
    requests = [req(f"r{i}") for i in range(6)]
    for request in requests:
        scheduler.add(request)
    step_tokens(scheduler.schedule())
    assert pool.free_slots == 0

    requests[1].cancel()  # running
    requests[5].cancel()  # waiting
    plan = scheduler.schedule()

    assert ids(plan.finished) == ["r5", "r1"]  # waiting ones first, then running, each in order
    assert all(r.status is RequestStatus.FINISHED and r.finish_reason == "cancelled" for r in plan.finished)
    assert all(r.slot is None for r in plan.finished)
    assert ids(plan.decode) == ["r0", "r2", "r3"]
    # The freed slot goes to the next in the queue in the same step; the cancelled one never runs.
    assert ids(plan.prefill) == ["r4"]
    assert plan.prefill[0].slot == 1
    assert scheduler.waiting == ()

    for request in requests:
        request.cancel()
    last = scheduler.schedule()

    assert ids(last.finished) == ["r0", "r2", "r3", "r4"]
    assert last.prefill == () and last.decode == ()
    assert pool.free_slots == MAX_BATCH
    assert [pool.owner(slot) for slot in range(MAX_BATCH)] == [None] * MAX_BATCH
    assert (scheduler.num_running, scheduler.num_waiting, scheduler.has_work) == (0, 0, False)
    assert scheduler.schedule().finished == ()  # reported once


def test_queue_full_at_max_waiting_and_room_again_once_admitted() -> None:
    scheduler, _ = make_scheduler(max_waiting=2)
    scheduler.add(req("a"))
    scheduler.add(req("b"))

    with pytest.raises(QueueFull, match=r"^the waiting queue is full: 2 requests already wait$"):
        scheduler.add(req("c"))
    assert ids(scheduler.waiting) == ["a", "b"]

    scheduler.schedule()
    scheduler.add(req("c"))
    assert ids(scheduler.waiting) == ["c"]


def test_queue_full_counts_waiting_requests_not_running_ones() -> None:
    scheduler, _ = make_scheduler(max_waiting=1)
    for i in range(MAX_BATCH):
        scheduler.add(req(f"r{i}"))
        scheduler.schedule()
    scheduler.add(req("waits"))

    with pytest.raises(QueueFull):
        scheduler.add(req("refused"))
    assert (scheduler.num_running, scheduler.num_waiting) == (MAX_BATCH, 1)


def test_finish_frees_the_slot_at_once_and_records_the_reason_and_time() -> None:
    clock = Clock()
    scheduler, pool = make_scheduler(clock=clock)
    a, b = req("a"), req("b")
    scheduler.add(a)
    scheduler.add(b)
    step_tokens(scheduler.schedule())
    clock.now = 123.5

    scheduler.finish(a, "length")

    assert (a.status, a.finish_reason, a.finish_time, a.slot) == (RequestStatus.FINISHED, "length", 123.5, None)
    assert pool.free_slots == MAX_BATCH - 1
    assert pool.owner(0) is None
    assert ids(scheduler.running) == ["b"]
    assert ids(scheduler.schedule().decode) == ["b"]

    clock.now = 200.0
    scheduler.finish(a, "stop")  # already finished: the first reason stands
    assert (a.finish_reason, a.finish_time) == ("length", 123.5)
    assert pool.free_slots == MAX_BATCH - 1


def test_finish_a_waiting_request_takes_it_out_of_the_queue() -> None:
    scheduler, pool = make_scheduler()
    a = req("a")
    scheduler.add(a)

    scheduler.finish(a, "timeout")

    assert (a.status, a.finish_reason, a.slot) == (RequestStatus.FINISHED, "timeout", None)
    assert scheduler.waiting == () and not scheduler.has_work
    assert scheduler.schedule().prefill == ()
    assert pool.free_slots == MAX_BATCH


def test_requests_sharing_an_id_are_scheduled_as_separate_sequences() -> None:
    # Request ids belong to callers (a /predict call runs several inputs under one id).
    scheduler, pool = make_scheduler()
    first, second = req("same"), req("same")
    scheduler.add(first)
    scheduler.add(second)
    plan = scheduler.schedule()
    assert plan.prefill == (first, second) and first.slot != second.slot
    scheduler.finish(first, "stop")
    assert scheduler.running == (second,) and pool.free_slots == MAX_BATCH - 1


def test_only_waiting_requests_can_be_added() -> None:
    scheduler, _ = make_scheduler()
    done = req("done")
    done.status = RequestStatus.FINISHED
    with pytest.raises(ValueError, match="is finished, not waiting"):
        scheduler.add(done)


@pytest.mark.parametrize(("max_waiting", "max_prefill_tokens", "message"), [(0, 8, "max_waiting"), (1, 0, "prefill")])
def test_limits_below_one_are_refused(max_waiting: int, max_prefill_tokens: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scheduler(make_pool(), max_waiting, max_prefill_tokens)
