"""The request log of `aieng serve`: one JSON line per answered request, and finding one again.

`$AIENG_HOME/logs/requests.jsonl` by default (`aieng serve --request-log PATH` for another
file, `--no-request-log` for none). Each line is one JSON object, keys in this order:

    {"time", "request_id", "method", "path", "status", "bundle_id", "data_version",
     "latency_ms", [finish_reason, prompt_tokens, completion_tokens]}

`bundle_id` and `data_version` are the values the response's X-Aieng-Bundle-Id and
X-Aieng-Data-Version headers carried (`none` when no bundle was served). The file is opened
with O_APPEND and each line is written whole by one write() as its request ends: a reader
sees whole lines, several servers may share one file, and nothing already written is ever
rewritten. A line reaches the operating system at once but is not fsynced (a machine crash
may lose the last lines, never garble an earlier one). A rotation that renames the file
(logrotate's default) is noticed on the next line, which opens a new file at the path.

`find_request` answers `aieng lineage --request ID`: the last line of the log with that
request id (a client may reuse an id; the last answer is the one it got last), found by a
reverse search of the memory-mapped file, so a log of a million lines answers in
milliseconds. This module imports nothing heavier than the standard library.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from pathlib import Path
from typing import Any

LOGS_DIR = "logs"  # under $AIENG_HOME
REQUEST_LOG_FILE = "requests.jsonl"
# Header (and record) values that are not ids: no bundle was serving (following an empty
# pointer, loading, failed); a bundle whose dataset_manifest is not in its store.
NO_BUNDLE = "none"
UNKNOWN_DATA_VERSION = "unknown"
KEYS = ("time", "request_id", "method", "path", "status", "bundle_id", "data_version", "latency_ms")


def default_request_log(home: Path | str) -> Path:
    """Where `aieng serve` logs requests and `aieng lineage --request` looks for them by default."""
    return Path(home) / LOGS_DIR / REQUEST_LOG_FILE


def encode_line(record: dict[str, Any]) -> bytes:
    """A record as one line: compact JSON (`"request_id":"..."` spelled exactly as find_request
    searches for it), a newline at the end."""
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.encode("utf-8") + b"\n"


class RequestLog:
    """Appends records to the request log at `path` (its directory is created). OSError when
    the file cannot be opened, naming it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd = -1
        self._inode: tuple[int, int] | None = None
        self._open()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        info = os.fstat(fd)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._inode = fd, (info.st_dev, info.st_ino)

    def _rotated(self) -> bool:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (info.st_dev, info.st_ino) != self._inode

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as one line, whole (one write(); a short write is continued)."""
        line = encode_line(record)
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"{self.path}: the request log is closed")
            if self._rotated():
                self._open()
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class RequestNotLogged(ValueError):
    """The request id is not in the request log, or there is no request log (named)."""


def find_request(path: Path | str, request_id: str) -> dict[str, Any]:
    """The last record of the request log at `path` whose request_id is `request_id`.
    RequestNotLogged naming the file when it is missing or holds no such line; a line that
    matches but is not a JSON record (a torn last line) is passed over for an earlier one."""
    path = Path(path)
    # `"request_id":"ID"`: inside a JSON string every quote is escaped, so only the key matches.
    needle = encode_line({"request_id": request_id})[1:-2]
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                raise RequestNotLogged(f"request {request_id!r} is not in the request log {path} (it is empty)")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                end = size
                while True:
                    found = data.rfind(needle, 0, end)
                    if found < 0:
                        break
                    start = data.rfind(b"\n", 0, found) + 1
                    stop = data.find(b"\n", found)
                    line = data[start : stop if stop >= 0 else size]
                    try:
                        record = json.loads(line)
                    except ValueError:
                        record = None
                    if isinstance(record, dict) and record.get("request_id") == request_id:
                        return record
                    end = start
    except FileNotFoundError:
        raise RequestNotLogged(
            f"there is no request log at {path}: `aieng serve` writes one there unless started with "
            "--no-request-log (give the server's --request-log PATH with --request-log)"
        ) from None
    raise RequestNotLogged(f"request {request_id!r} is not in the request log {path} ({size:,} bytes)")
