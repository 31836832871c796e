"""The YAML configuration: both shipped configs load; every mistake names the key and file."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from aieng_core.config import AiengConfig, ConfigError, load_config, resolve_config_path
from tests.conftest import REPO_ROOT, TINY_CONFIG

PIPELINE_CONFIG = REPO_ROOT / "configs" / "pipeline.yaml"


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def config_error(path: Path, one_line: bool = True) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path.resolve()) in message, message
    if one_line:
        assert "\n" not in message  # printable as one CLI error line
    return message


def test_pipeline_config_loads_with_its_documented_values() -> None:
    config = load_config(PIPELINE_CONFIG)
    assert config.data.start_date == dt.date(2026, 1, 1)
    assert (config.data.min_chars, config.data.max_chars, config.data.batch_rows) == (20, 200_000, 4096)
    assert (config.tokenizer.vocab_size, config.tokenizer.min_frequency) == (4096, 2)
    assert (config.tokenizer.eos_token, config.tokenizer.pad_token) == ("<|endoftext|>", "<|pad|>")
    assert config.dataset.validation_fraction == 0.05
    assert config.dataset.split_seed == "aieng-split-v1"


def test_tiny_config_loads_with_its_documented_values() -> None:
    config = load_config(TINY_CONFIG)
    assert (config.data.min_chars, config.data.batch_rows) == (10, 64)
    assert config.tokenizer.vocab_size == 512
    assert config.dataset.validation_fraction == 0.1


def test_default_path_comes_from_AIENG_CONFIG(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The autouse fixture points AIENG_CONFIG at tiny.yaml.
    assert resolve_config_path() == TINY_CONFIG.resolve()
    assert load_config().tokenizer.vocab_size == 512
    other = write_config(tmp_path, "tokenizer:\n  vocab_size: 1000\n")
    monkeypatch.setenv("AIENG_CONFIG", str(other))
    assert load_config().tokenizer.vocab_size == 1000
    # An explicit argument wins over the environment.
    assert load_config(PIPELINE_CONFIG).tokenizer.vocab_size == 4096


def test_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_config(write_config(tmp_path, "")) == AiengConfig()


def test_omitted_keys_take_their_defaults(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "data:\n  min_chars: 3\n"))
    assert config.data.min_chars == 3
    assert config.data.max_chars == 200_000
    assert config.tokenizer == AiengConfig().tokenizer


@pytest.mark.parametrize(
    "text, key",
    [
        ("data:\n  min_char: 10\n", "data.min_char"),
        ("tokenizer:\n  vocab: 512\n", "tokenizer.vocab"),
        ("dataset:\n  seed: x\n", "dataset.seed"),
        ("colour:\n  hue: 2\n", "colour"),
    ],
)
def test_unknown_key_is_named(tmp_path: Path, text: str, key: str) -> None:
    message = config_error(write_config(tmp_path, text))
    assert f"{key}: unknown key" in message


@pytest.mark.parametrize(
    "text, key",
    [
        ('data:\n  min_chars: "20"\n', "data.min_chars"),
        ("data:\n  min_chars: 20.5\n", "data.min_chars"),
        ("data:\n  min_chars: true\n", "data.min_chars"),
        ("data:\n  batch_rows: [64]\n", "data.batch_rows"),
        ("data:\n  start_date: not-a-date\n", "data.start_date"),
        ("tokenizer:\n  vocab_size: 512.0\n", "tokenizer.vocab_size"),
        ("tokenizer:\n  eos_token: 5\n", "tokenizer.eos_token"),
        ("dataset:\n  split_seed: 12\n", "dataset.split_seed"),
        ("dataset:\n  validation_fraction: [0.1]\n", "dataset.validation_fraction"),
        ("data: 5\n", "data"),
    ],
)
def test_wrong_type_is_named(tmp_path: Path, text: str, key: str) -> None:
    message = config_error(write_config(tmp_path, text))
    assert f"{key}: " in message
    assert "unknown key" not in message


@pytest.mark.parametrize(
    "text, key",
    [
        ("data:\n  min_chars: -1\n", "data.min_chars"),
        ("data:\n  max_chars: 0\n", "data.max_chars"),
        ("data:\n  batch_rows: 0\n", "data.batch_rows"),
        ("data:\n  batch_rows: 1000001\n", "data.batch_rows"),
        ("tokenizer:\n  vocab_size: 299\n", "tokenizer.vocab_size"),
        ("tokenizer:\n  min_frequency: 0\n", "tokenizer.min_frequency"),
        ('tokenizer:\n  pad_token: ""\n', "tokenizer.pad_token"),
        ("dataset:\n  validation_fraction: 0\n", "dataset.validation_fraction"),
        ("dataset:\n  validation_fraction: 1.0\n", "dataset.validation_fraction"),
        ("dataset:\n  validation_fraction: 1.5\n", "dataset.validation_fraction"),
    ],
)
def test_out_of_range_value_is_named(tmp_path: Path, text: str, key: str) -> None:
    message = config_error(write_config(tmp_path, text))
    assert f"{key}: " in message


def test_bounds_at_the_limits_are_accepted(tmp_path: Path) -> None:
    config = load_config(
        write_config(
            tmp_path, "data:\n  min_chars: 0\n  max_chars: 1\n  batch_rows: 1000000\ntokenizer:\n  vocab_size: 300\n"
        )
    )
    assert (config.data.min_chars, config.data.max_chars, config.data.batch_rows) == (0, 1, 1_000_000)
    assert config.tokenizer.vocab_size == 300


def test_min_chars_above_max_chars_is_rejected(tmp_path: Path) -> None:
    message = config_error(write_config(tmp_path, "data:\n  min_chars: 50\n  max_chars: 40\n"))
    assert "data: " in message and "min_chars (50) must not exceed max_chars (40)" in message


def test_equal_eos_and_pad_tokens_are_rejected(tmp_path: Path) -> None:
    message = config_error(write_config(tmp_path, 'tokenizer:\n  eos_token: "<x>"\n  pad_token: "<x>"\n'))
    assert "tokenizer: " in message and "must differ" in message


def test_several_mistakes_are_all_reported(tmp_path: Path) -> None:
    message = config_error(
        write_config(tmp_path, "data:\n  min_chars: -1\n  colour: red\ntokenizer:\n  vocab_size: 1\n")
    )
    for key in ("data.min_chars", "data.colour", "tokenizer.vocab_size"):
        assert key in message


def test_missing_file(tmp_path: Path) -> None:
    message = config_error(tmp_path / "nope.yaml")
    assert "not found" in message


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    message = config_error(write_config(tmp_path, "- data\n- tokenizer\n"))
    assert "mapping" in message


def test_invalid_yaml(tmp_path: Path) -> None:
    # YAML's own message points at the line and column, over several lines.
    message = config_error(write_config(tmp_path, "data: {min_chars: 1\n"), one_line=False)
    assert "cannot read config" in message


def test_section_hash_depends_only_on_that_section(tmp_path: Path) -> None:
    base = load_config(TINY_CONFIG)
    changed = load_config(write_config(tmp_path, TINY_CONFIG.read_text().replace("vocab_size: 512", "vocab_size: 600")))
    assert changed.tokenizer.vocab_size == 600
    assert changed.section_sha256("tokenizer") != base.section_sha256("tokenizer")
    assert changed.section_sha256("data") == base.section_sha256("data")
    assert changed.section_sha256("dataset") == base.section_sha256("dataset")
    assert load_config(TINY_CONFIG).section_sha256("tokenizer") == base.section_sha256("tokenizer")


@pytest.mark.parametrize("key", ["max_batch", "golden_prompts", "default_temperature", "allow_partial_model"])
def test_a_recipe_key_left_under_serving_says_where_it_moved(tmp_path: Path, key: str) -> None:
    """serving: was split: what decides a bundle moved to bundle:. A config written before says
    so by name, not just "unknown key"."""
    message = config_error(write_config(tmp_path, f"serving:\n  {key}: 1\n"))
    assert message.endswith(
        f"invalid config: serving.{key}: moved to bundle.{key} "
        "(the bundle's recipe; serving: keeps what the server reads)"
    )


def test_warmup_lengths_must_fit_the_bundles_context(tmp_path: Path) -> None:
    message = config_error(
        write_config(tmp_path, "bundle:\n  max_context: 16\nserving:\n  warmup_prompt_lengths: [4, 16]\n")
    )
    assert "serving.warmup_prompt_lengths: 16 is not below bundle.max_context (16)" in message
