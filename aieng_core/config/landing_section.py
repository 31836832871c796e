"""The landing sensor's section: how the landing folder is watched. No artifact reads it, so
no artifact id depends on it."""

from __future__ import annotations

from pydantic import Field

from aieng_core.config.pipeline_sections import Section


class LandingConfig(Section):
    """landing_sensor: new or changed files in $AIENG_HOME/raw/YYYY-MM-DD/ start an ingest run."""

    settle_seconds: float = Field(
        default=60.0,
        ge=0.0,
        strict=False,
        description=(
            "A landing folder is ingested once neither it nor any of its data files changed for this long: "
            "a file still being written keeps its modification time moving."
        ),
    )
    interval_seconds: int = Field(
        default=30, ge=5, description="How often the landing sensor looks (its minimum interval between ticks)."
    )
