"""Progress reports for long work: a line every few seconds, never one per row."""

from __future__ import annotations

import logging
import time
from typing import Any


class Progress:
    def __init__(self, logger: logging.Logger | Any, label: str, every_seconds: float = 10.0) -> None:
        self._logger = logger
        self._label = label
        self._every = every_seconds
        self._start = time.monotonic()
        self._last = self._start

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def update(self, message: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= self._every:
            self._last = now
            self._logger.info(f"{self._label}: {message} ({now - self._start:.1f}s)")
