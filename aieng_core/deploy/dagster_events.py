"""Telling Dagster that the production pointer moved outside a Dagster run.

What the Dagster UI shows as deployed is the latest materialization of the asset
`production_deployment`. A gate run records one when it promotes; a promote or rollback made
with `aieng deploy` records one here: a runless asset materialization POSTed to the Dagster
webserver named by `$AIENG_DAGSTER_URL` (`POST <url>/report_asset_materialization/
production_deployment`, the REST endpoint of Dagster 1.13's webserver, which stores it with
`DagsterInstance.report_runless_asset_event`). Its metadata names the change (`event_metadata`)
and its data version is `<bundle_id>:<sequence>`, the form the asset records.

A materialization, not an observation: an observation leaves the asset's latest
materialization (what the UI shows as the asset's current state) as it was, and a moved pointer
*is* a change of what the asset is (which bundle production serves).

Nothing here can fail a change already made: with `$AIENG_DAGSTER_URL` unset, or Dagster not
answering within TIMEOUT_S, the change is not reported and the code location's
`deployment_pointer_sensor` records it from the pointer's history when it next runs. The core
never imports dagster: this is stdlib HTTP (urllib).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from aieng_core.asset_keys import PRODUCTION_DEPLOYMENT
from aieng_core.store.pointers import PRODUCTION

DAGSTER_URL_ENV = "AIENG_DAGSTER_URL"  # e.g. http://127.0.0.1:3000 (`make dev`)
TIMEOUT_S = 2.0
ENDPOINT = "/report_asset_materialization/"
SENSOR = "deployment_pointer_sensor"  # orchestration/sensors.py: records what was not reported
VERDICT_CHARS = 120  # one line on the asset page


def dagster_url() -> str | None:
    """`$AIENG_DAGSTER_URL` without a trailing slash, or None when unset or empty."""
    url = os.environ.get(DAGSTER_URL_ENV, "").strip()
    return url.rstrip("/") or None


def data_version(event: dict[str, Any]) -> str:
    """`<bundle_id>:<sequence>` of the pointer after `event` (`none` when it names no bundle)."""
    return f"{event['to'] or 'none'}:{event['sequence']}"


def event_metadata(event: dict[str, Any], reported_by: str) -> dict[str, Any]:
    """The metadata of the materialization recording `event` (a pointer history event): plain
    JSON values, the same whoever records it (the CLI, or the sensor)."""
    metadata: dict[str, Any] = {
        "verdict": event_verdict(event, reported_by),  # the one line the asset page shows first
        "bundle_id": event["to"] or "none",  # what the pointer names after the change
        "sequence": event["sequence"],
        "action": event["action"],
        "from": event["from"] or "none",
        "actor": event["actor"],
        "reason": event["reason"],
        "time": event["time"],
        "pointer": event["pointer"],
        "reported_by": reported_by,
    }
    if event.get("withdrawn") is not None:  # a rollback: the bundle it withdrew
        metadata["withdrawn"] = event["withdrawn"]
    if "allow_withdrawn" in event:  # a promote: whether it overrode a withdrawal
        metadata["allow_withdrawn"] = bool(event["allow_withdrawn"])
    metadata["history_event"] = {key: value for key, value in event.items() if key != "figures"}
    return metadata


def event_verdict(event: dict[str, Any], reported_by: str) -> str:
    """`rollback by aieng deploy rollback: production serves A (sequence 3, was B)`, at most
    VERDICT_CHARS long (the gate's own materializations say promoted or refused the same way)."""
    line = (
        f"{event['action']} by {reported_by}: {event['pointer']} serves {event['to'] or 'nothing'} "
        f"(sequence {event['sequence']}, was {event['from'] or 'none'})"
    )
    return line if len(line) <= VERDICT_CHARS else line[: VERDICT_CHARS - 1] + "…"


def event_description(event: dict[str, Any], reported_by: str) -> str:
    return (
        f"{event['action']} on {event['pointer']}: {event['from'] or '(none)'} -> {event['to'] or '(none)'} "
        f"(sequence {event['sequence']}), recorded by {reported_by}"
    )


def report_pointer_change(event: dict[str, Any], pointer: str) -> str | None:
    """Record `event` (a change of `pointer`, just applied) as a runless materialization of
    production_deployment in the Dagster instance behind `$AIENG_DAGSTER_URL`.

    Returns None when Dagster was told, or when `pointer` is not production (no asset shows
    another pointer). Otherwise a one-line note saying why Dagster was not told and that the
    pointer sensor will record the change. Never raises for a failure to reach Dagster."""
    if pointer != PRODUCTION:
        return None
    later = f"{SENSOR} records sequence {event['sequence']} when it next runs"
    url = dagster_url()
    if url is None:
        return f"{DAGSTER_URL_ENV} is not set: Dagster was not told; {later}"
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        return f"{DAGSTER_URL_ENV}={url!r} is not an http:// or https:// URL: Dagster was not told; {later}"
    reported_by = f"aieng deploy {event['action']}"
    body = {
        "metadata": event_metadata(event, reported_by),
        "data_version": data_version(event),
        "description": event_description(event, reported_by),
    }
    request = urllib.request.Request(
        f"{url}{ENDPOINT}{PRODUCTION_DEPLOYMENT}",
        data=json.dumps(body).encode("utf-8"),
        # Exactly this content type: the webserver refuses any other (a charset parameter included).
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer = response.read()
    except urllib.error.HTTPError as exc:
        return f"Dagster at {url} refused the report: HTTP {exc.code}: {_error_text(exc.read())}; {later}"
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, timed out, not HTTP
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"Dagster at {url} was not told ({type(exc).__name__}: {reason}); {later}"
    error = _error_in(answer)
    if error is not None:
        return f"Dagster at {url} refused the report: {error}; {later}"
    return None


def tell_dagster(event: dict[str, Any], pointer: str) -> None:
    """What `aieng deploy promote|rollback` calls once the change is made: report it, and when
    `$AIENG_DAGSTER_URL` is set but Dagster was not told, say so in one line on stderr (unset:
    nothing is said; the sensor covers it)."""
    note = report_pointer_change(event, pointer)
    if note is not None and dagster_url() is not None:
        print(f"aieng: warning: {' '.join(note.split())}", file=sys.stderr)


def _error_in(answer: bytes) -> str | None:
    """The webserver answers `{}` when it recorded the event, `{"error": ...}` when not."""
    try:
        doc = json.loads(answer or b"{}")
    except ValueError:
        return f"not the webserver's JSON answer: {answer[:200]!r}"
    if isinstance(doc, dict) and doc.get("error"):
        return str(doc["error"])
    return None


def _error_text(answer: bytes) -> str:
    return _error_in(answer) or answer[:200].decode("utf-8", errors="replace") or "no message"
