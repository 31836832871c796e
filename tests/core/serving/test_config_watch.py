"""aieng_config_valid: the server says whether the config file it was started with still loads,
re-reading it on a scrape when it changed, and logs the key and the reason once per change
(configs/alerts.yml: AiengConfigInvalid)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aieng_core.config import load_config
from aieng_core.serving.http.app import create_app
from aieng_core.serving.http.config_watch import ConfigWatch
from tests.conftest import TINY_CONFIG
from tests.core.serving.http_helpers import serving

BAD_KEY = "training.max_steps: Input should be greater than or equal to 1 (got -3)"


def break_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "max_steps:" in text
    path.write_text(text.replace("max_steps:", "max_steps: -3 #", 1), encoding="utf-8")


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.yaml"
    shutil.copy(TINY_CONFIG, path)
    return path


def logged(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "aieng.serving.config"]


def test_a_broken_file_is_reported_once_per_change(config_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aieng.serving.config")
    watch = ConfigWatch(config_file)
    assert watch.problem() is None
    assert logged(caplog) == []  # a file that loads is not news

    good = config_file.read_text(encoding="utf-8")
    break_it(config_file)
    problem = watch.problem()
    assert problem == f"{config_file}: invalid config: {BAD_KEY}"
    assert watch.problem() == problem  # scraped again: the same answer, no second log line
    ((level, message),) = logged(caplog)
    assert level == logging.ERROR
    assert message.startswith(f"the config file no longer loads: {problem} (a Dagster code location reading it")

    config_file.write_text(good, encoding="utf-8")
    assert watch.problem() is None
    assert logged(caplog)[1:] == [(logging.INFO, f"the config file {config_file} loads again")]

    config_file.unlink()  # gone: a problem too, named as load_config names it
    assert watch.problem() == f"{config_file}: config file not found"


def config_samples(body: bytes) -> dict[str, float]:
    return {
        sample.labels["path"]: sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "aieng_config_valid"
    }


def test_metrics_say_whether_the_servers_config_file_loads(config_file: Path) -> None:
    # No bundle to serve (its load fails at once): /metrics answers all the same.
    app = create_app(Path("/nonexistent"), load_config(config_file), None, config_path=config_file)
    with serving(app, ready_path="/health/live") as server:
        assert config_samples(server.get("/metrics").body) == {str(config_file): 1.0}
        break_it(config_file)
        assert config_samples(server.get("/metrics").body) == {str(config_file): 0.0}
        shutil.copy(TINY_CONFIG, config_file)
        assert config_samples(server.get("/metrics").body) == {str(config_file): 1.0}


def test_an_app_made_without_its_config_path_exports_no_series() -> None:
    app = create_app(Path("/nonexistent"), load_config(TINY_CONFIG), None)
    with serving(app, ready_path="/health/live") as server:
        assert config_samples(server.get("/metrics").body) == {}
