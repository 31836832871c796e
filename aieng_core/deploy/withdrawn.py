"""Withdrawn bundles: what a rollback left is not deployed again unless someone says so.

A rollback records the bundle it left in its history event (`withdrawn`: its `from`); the
pointer's applied history is the one source of what is withdrawn: a bundle is withdrawn from
the rollback that left it until an applied change makes it current again (a promote with
`allow_withdrawn`, recorded as such in its event). Histories written before events carried
`withdrawn` are read the same way: a rollback withdrew its `from`.

Withdrawal is by bundle id: a retrain that produces the same id produced the same bundle
(ids come from recipes), and it stays withdrawn. A rollback never lands on a withdrawn bundle
either: withdrawn entries on top of the stack are passed over (and recorded in the event).
"""

from __future__ import annotations

from typing import Any

from aieng_core.asset_keys import SERVING_BUNDLE as KIND
from aieng_core.store.pointers import DeploymentError

ALLOW_FLAG = "--allow-withdrawn"


class BundleWithdrawn(DeploymentError):
    """A promote of a bundle a rollback withdrew, without `allow_withdrawn`. Nothing changed."""

    def __init__(self, bundle_id: str, event: dict[str, Any], pointer: str) -> None:
        super().__init__(withdrawn_refusal(bundle_id, event, pointer))
        self.bundle_id = bundle_id
        self.event = event  # the applied rollback event that withdrew it


def withdrawn_refusal(bundle_id: str, event: dict[str, Any], pointer: str) -> str:
    """The refusal of a promote of `bundle_id`, naming the rollback `event` that withdrew it."""
    reason = f": {event['reason']!r}" if event.get("reason") else ", no reason given"
    return (
        f"{KIND} {bundle_id} was withdrawn from {pointer} by the rollback at {event['time']} "
        f"(sequence {event['sequence']}, by {event['actor']}{reason}); it is not promoted again unless asked "
        f"explicitly ({ALLOW_FLAG})"
    )


def withdrawn_by(event: dict[str, Any]) -> str | None:
    """The bundle a rollback event withdrew (older events: its `from`); None for a promote."""
    if event["action"] != "rollback":
        return None
    return event["withdrawn"] if "withdrawn" in event else event["from"]


def withdrawn_from(applied_events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """bundle id -> the rollback event that withdrew it, from a pointer's applied history
    (oldest first). A later change that makes the bundle current again clears it."""
    withdrawn: dict[str, dict[str, Any]] = {}
    for event in applied_events:
        left = withdrawn_by(event)
        if left is not None:
            withdrawn[left] = event
        if event["to"] is not None:
            withdrawn.pop(event["to"], None)
    return withdrawn


def rollback_plan(
    stack: list[str], withdrawn: dict[str, dict[str, Any]], leaving: str | None
) -> tuple[str | None, list[str], list[str]]:
    """(target, the stack after the rollback, the withdrawn entries passed over).

    The target is the topmost stack entry that is neither withdrawn nor `leaving` (the current
    bundle, which this rollback withdraws); None when no entry is left."""
    remaining = list(stack)
    skipped: list[str] = []
    while remaining:
        top = remaining.pop()
        if top in withdrawn or top == leaving:
            skipped.append(top)
            continue
        return top, remaining, skipped
    return None, remaining, skipped


def rollback_target(stack: list[str], withdrawn: dict[str, dict[str, Any]], leaving: str | None) -> str | None:
    """What a rollback would make current now (see rollback_plan), or None."""
    return rollback_plan(stack, withdrawn, leaving)[0]
