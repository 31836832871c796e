"""The report's time budget: a measurement starts only while `benchmark.max_seconds` has not
run out; every one that did not start is named, so a truncated report says what it lacks."""

from __future__ import annotations

import time
from collections.abc import Callable


class TimeBudget:
    """Reads `clock` (seconds) once when made and once per `allows` call until the budget has
    run out; from then on every measurement asked about is skipped without reading it again."""

    def __init__(self, max_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_seconds = max_seconds
        self.clock = clock
        self.started = clock()
        self.exceeded_after: float | None = None  # elapsed seconds when the budget was found spent
        self.skipped: list[str] = []

    def allows(self, measurement: str) -> bool:
        """Whether `measurement` may start now; if not, it is recorded as skipped."""
        if self.exceeded_after is None:
            elapsed = self.clock() - self.started
            if elapsed <= self.max_seconds:
                return True
            self.exceeded_after = elapsed
        self.skipped.append(measurement)
        return False

    @property
    def truncated(self) -> bool:
        return bool(self.skipped)

    def reason(self) -> str | None:
        if self.exceeded_after is None or not self.skipped:
            return None
        return (
            f"benchmark.max_seconds ({self.max_seconds:g} s) was exceeded after {self.exceeded_after:.3f} s; "
            f"not measured: {', '.join(self.skipped)}"
        )
