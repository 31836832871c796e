"""The store section of the config: what `aieng store gc` keeps besides what a root reaches.
Read only by the command line, never hashed into an artifact's id."""

from __future__ import annotations

from pydantic import Field

from aieng_core.config.pipeline_sections import Section


class StoreConfig(Section):
    """Retention (`aieng store gc`): besides every pointer's bundle, its rollback stack, pins and
    current refs, with all they reach, gc keeps what is recent. Its flags override these."""

    gc_keep_newer_than_days: float = Field(
        default=7.0,
        ge=0,
        strict=False,
        description="Artifacts created less than this many days ago are kept with all they reach "
        "(`--keep-newer-than-days`): a step may be building from one a newer build already replaced in its ref.",
    )
    gc_rollback_depth: int | None = Field(
        default=None,
        ge=0,
        description="How many bundles of each deployment pointer's rollback stack are kept, from the top "
        "(`--rollback-depth`); null: the whole stack. A bundle beyond it can no longer be rolled back to once gc ran.",
    )
