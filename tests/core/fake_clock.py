"""A fake training clock, so tests decide exactly where `max_minutes` runs out, without sleeping."""

from __future__ import annotations

from typing import Any


class StepClock:
    """Reads 0 at first and `seconds_per_step` more after every step: pass the clock as
    train(clock=...) and its on_step as the step callback."""

    def __init__(self, seconds_per_step: float) -> None:
        self.now, self.seconds_per_step = 0.0, seconds_per_step

    def __call__(self) -> float:
        return self.now

    def on_step(self, step: int, record: dict[str, Any]) -> None:
        self.now += self.seconds_per_step
