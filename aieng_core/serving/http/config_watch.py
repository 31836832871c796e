"""Whether the config file the server was started with still loads: `aieng_config_valid`.

Why the server says it: the Dagster code location reads its config file when it loads, and a
bad file stops it loading. Its sensors and schedules then stop ticking, and Dagster says so only
on the UI's Deployment page and in one log line when the code location loads; nothing repeats
it. This process is the one Prometheus scrapes and alerts on (configs/alerts.yml:
AiengConfigInvalid), so it re-validates the file on every scrape and says whether it loads, with
a log line naming the key and the reason whenever that changes.

What it checks: the file `aieng serve` was started with (--config, else $AIENG_CONFIG, else
configs/pipeline.yaml), validated as every reader validates it (`load_config`: each key, type
and range). That is the code location's file when both run with one AIENG_CONFIG, as the
Makefile's targets do; a server started with another file says nothing about the code
location's. Not checked: the cron expressions of `gate:` (only Dagster parses those; a bad one
stops the code location too), or a code location broken by anything but its config.

The server itself keeps the settings it started with: a bad file changes nothing it does, but
it would not start again with it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from aieng_core.config import ConfigError, load_config

log = logging.getLogger("aieng.serving.config")

# File times advance in coarse ticks (milliseconds), so an edit just after a look may leave the
# whole signature as it was: a file changed this recently is read again at every look.
SETTLE_S = 2.0


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    """What changes when the file is edited or replaced; None when it cannot be stat'ed or
    changed in the last SETTLE_S seconds (then it is always read)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    if time.time() - stat.st_mtime < SETTLE_S:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


class ConfigWatch:
    """The config file at `path`: `problem()` re-reads it when it changed since the last look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature: tuple[int, int, int, int] | None = None
        self._looked = False
        self.error: str | None = None  # the file's problem at the last look; None: it loads

    def problem(self) -> str | None:
        """Why the file does not load now (the ConfigError's one line), or None when it loads.
        A file unchanged since the last look is not read again (a read costs ~20 ms of the
        event loop); a missing one, or one just edited, is read every time."""
        signature = _signature(self.path)
        if self._looked and signature is not None and signature == self._signature:
            return self.error
        try:
            load_config(self.path)
            error = None
        except ConfigError as exc:
            error = str(exc)
        if error != self.error:
            if error is not None:
                log.error(
                    "the config file no longer loads: %s (a Dagster code location reading it cannot load, so its "
                    "sensors and schedules stop; this server keeps the settings it started with)",
                    error,
                    extra={"error": error},
                )
            else:
                log.info("the config file %s loads again", self.path)
        self._signature, self._looked, self.error = signature, True, error
        return error
