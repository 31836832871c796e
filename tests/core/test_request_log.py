"""The request log (aieng_core/store/request_log.py): whole lines appended by any number of
writers, never rewritten, and the last record of a request id found again, whatever else
the file holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aieng_core.store.request_log import (
    KEYS,
    RequestLog,
    RequestNotLogged,
    default_request_log,
    encode_line,
    find_request,
)


def record(request_id: str, status: int = 200, bundle_id: str = "b1", **extra: object) -> dict[str, object]:
    return {
        "time": "2026-02-01T10:00:00.000+00:00",
        "request_id": request_id,
        "method": "POST",
        "path": "/generate",
        "status": status,
        "bundle_id": bundle_id,
        "data_version": "d" * 64,
        "latency_ms": 12.5,
        **extra,
    }


def test_the_default_log_lives_under_the_home(tmp_path: Path) -> None:
    assert default_request_log(tmp_path) == tmp_path / "logs" / "requests.jsonl"


def test_records_are_appended_as_whole_lines_by_every_writer(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "requests.jsonl"
    first, second = RequestLog(path), RequestLog(path)  # two servers sharing one file
    assert path.parent.is_dir()
    for n in range(5):
        (first if n % 2 else second).append(record(f"r{n}"))
    first.close()
    second.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 6
    parsed = [json.loads(line) for line in lines[:-1]]
    assert [r["request_id"] for r in parsed] == [f"r{n}" for n in range(5)]
    assert list(parsed[0]) == list(KEYS)
    with pytest.raises(ValueError, match="closed"):
        first.append(record("late"))


def test_appending_never_rewrites_what_is_there(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(encode_line(record("old")))
    before = path.read_bytes()
    log = RequestLog(path)
    log.append(record("new"))
    log.close()
    assert path.read_bytes().startswith(before)
    assert find_request(path, "old")["request_id"] == "old"


def test_a_rotated_log_is_reopened_at_its_path(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path)
    log.append(record("before"))
    os.rename(path, tmp_path / "requests.jsonl.1")  # logrotate's default: rename, then a new file
    log.append(record("after"))
    log.close()
    assert [json.loads(line)["request_id"] for line in path.read_text().splitlines()] == ["after"]
    assert find_request(tmp_path / "requests.jsonl.1", "before")["request_id"] == "before"


def test_the_last_record_of_an_id_is_found_and_only_that_id(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    lines = [
        record("rid", bundle_id="first"),
        record("rid2", bundle_id="longer-id"),
        record("xrid", bundle_id="suffix"),
        # An id spelled inside another field's value is escaped there: never a match.
        record("other", path='/generate"request_id":"absent"'),
        record("rid", bundle_id="second"),
        record("rid-", bundle_id="prefix"),
    ]
    path.write_bytes(b"".join(encode_line(r) for r in lines))
    assert find_request(path, "rid")["bundle_id"] == "second"
    assert find_request(path, "rid2")["bundle_id"] == "longer-id"
    assert find_request(path, "xrid")["bundle_id"] == "suffix"
    with pytest.raises(RequestNotLogged, match=r"request 'absent' is not in the request log .*requests\.jsonl"):
        find_request(path, "absent")


def test_a_torn_last_line_is_passed_over_for_an_earlier_record(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    whole = encode_line(record("rid", bundle_id="whole"))
    torn = encode_line(record("rid", bundle_id="torn"))[:-20]  # a crash cut the write short
    path.write_bytes(whole + torn)
    assert find_request(path, "rid")["bundle_id"] == "whole"
    path.write_bytes(torn)
    with pytest.raises(RequestNotLogged, match="is not in the request log"):
        find_request(path, "rid")


def test_a_missing_or_empty_log_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(RequestNotLogged, match=f"there is no request log at {missing}"):
        find_request(missing, "rid")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(RequestNotLogged, match="it is empty"):
        find_request(empty, "rid")


def test_the_first_of_a_hundred_thousand_lines_is_found(tmp_path: Path) -> None:
    """The reverse search walks past every later line to the first one: what a lookup costs
    at its worst (measured in the closing note; no timing asserted here)."""
    path = tmp_path / "requests.jsonl"
    with open(path, "wb") as file:
        file.write(encode_line(record("needle", bundle_id="the-one")))
        file.writelines(encode_line(record(f"hay-{n}")) for n in range(100_000))
    assert find_request(path, "needle")["bundle_id"] == "the-one"
    assert find_request(path, "hay-99999")["request_id"] == "hay-99999"
