"""The HTTP request models: unknown fields and unsupported OpenAI parameters are refused with
the field named; defaults fill what a request leaves out. No server, no model."""

from __future__ import annotations

import io
import json
import logging

import pytest
from pydantic import ValidationError

from aieng_core.serving.http.api_models import CompletionRequest, GenerateRequest, PredictRequest, RequestDefaults
from aieng_core.serving.http.logs import JsonFormatter, bind_request, unbind_request
from aieng_core.serving.request import SamplingParams


def first_error(model: type, body: dict) -> dict:
    with pytest.raises(ValidationError) as raised:
        model.model_validate(body)
    return raised.value.errors()[0]


def test_best_of_below_n_is_refused_as_openai_refuses_it() -> None:
    error = first_error(CompletionRequest, {"prompt": "a", "n": 2, "best_of": 1})
    assert error["loc"] == ("best_of",) and "best_of (1) must be at least n (2)" in error["msg"]
    assert CompletionRequest.model_validate({"prompt": "a", "n": 3}).samples == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "a", "logprobs": 0, "echo": True}, "echo"),
        ({"prompt": "a", "best_of": 2}, "best_of"),
        ({"prompt": "a", "suffix": ""}, "suffix"),
        ({"prompt": "a", "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ],
)
def test_unsupported_openai_parameters_are_named(body: dict, field: str) -> None:
    error = first_error(CompletionRequest, body)
    assert error["loc"][0] == field
    assert "not supported" in error["msg"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "a", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "a", "frequency_penalty": -2.1}, "frequency_penalty"),
        ({"prompt": "a", "logit_bias": {"1": 101}}, "logit_bias"),
        ({"prompt": "a", "logit_bias": {"token": 1}}, "logit_bias"),
        ({"prompt": "a", "logit_bias": {"-3": 1}}, "logit_bias"),
        ({"prompt": "a", "logit_bias": {"²": 1}}, "logit_bias"),  # "²".isdigit(), but no int
        ({"prompt": "a", "logit_bias": {"١٢": 1}}, "logit_bias"),  # Arabic-Indic digits
        ({"prompt": "a", "logit_bias": {"1": 60, "01": 60}}, "logit_bias"),  # one id twice
    ],
)
def test_penalties_and_logit_bias_out_of_openai_ranges_are_named(body: dict, field: str) -> None:
    assert first_error(CompletionRequest, body)["loc"][0] == field


def test_penalties_and_logit_bias_reach_the_sampling_parameters() -> None:
    request = CompletionRequest.model_validate(
        {"prompt": "a", "presence_penalty": 0.5, "frequency_penalty": -1, "logit_bias": {"7": 2.5, "3": -100}}
    )
    params = request.sampling_params()
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -1.0)
    assert params.logit_bias == ((3, -100.0), (7, 2.5)) and params.adjusts_logits


def test_neutral_values_of_unsupported_parameters_are_accepted() -> None:
    request = CompletionRequest.model_validate(
        {"prompt": ["a", "b"], "n": 1, "best_of": 1, "logprobs": None, "echo": False, "presence_penalty": 0,
         "frequency_penalty": 0.0, "logit_bias": {}, "suffix": None, "user": "u", "top_k": -1, "seed": -5}
    )  # fmt: skip
    assert request.prompts == ["a", "b"]
    params = request.sampling_params()
    assert params == SamplingParams(max_new_tokens=16, temperature=1.0, top_k=0, top_p=1.0, seed=(-5) % (1 << 63))


def test_unknown_fields_are_refused_everywhere() -> None:
    assert first_error(CompletionRequest, {"prompt": "a", "max_new_tokens": 3})["type"] == "extra_forbidden"
    assert first_error(GenerateRequest, {"prompt": "a", "max_tokens": 3})["loc"] == ("max_tokens",)
    assert first_error(PredictRequest, {"inputs": ["a"], "options": {"n": 1}})["loc"] == ("options", "n")


def test_bounds() -> None:
    assert first_error(GenerateRequest, {"prompt": ""})["loc"] == ("prompt",)
    assert first_error(GenerateRequest, {"prompt": "a", "max_new_tokens": 0})["loc"] == ("max_new_tokens",)
    assert first_error(GenerateRequest, {"prompt": "a", "top_p": 1.5})["loc"] == ("top_p",)
    assert first_error(GenerateRequest, {"prompt": "a", "temperature": float("nan")})["loc"] == ("temperature",)
    assert first_error(GenerateRequest, {"prompt": "a", "stop": ["x"] * 17})["loc"] == ("stop",)
    assert first_error(GenerateRequest, {"prompt": "a", "request_id": "a b"})["loc"] == ("request_id",)
    assert first_error(PredictRequest, {"inputs": []})["loc"] == ("inputs",)
    assert first_error(CompletionRequest, {"prompt": [], "max_tokens": 1})["loc"][0] == "prompt"


def test_defaults_fill_what_a_request_leaves_out() -> None:
    defaults = RequestDefaults(max_new_tokens=12, temperature=0.5, top_k=7, top_p=0.9)
    params = GenerateRequest.model_validate({"prompt": "a", "top_k": 0, "stop": ["\n"]}).sampling_params(defaults)
    assert params == SamplingParams(max_new_tokens=12, temperature=0.5, top_k=0, top_p=0.9, stop=("\n",))


def test_log_lines_carry_the_bound_request_id() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("aieng.test.json")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        context, token = bind_request("rid-1")
        logger.info("inside", extra={"latency_ms": 1.5, "prompt_tokens": 3, "unlisted": "dropped"})
        context.request_id = "rid-2"
        logger.info("renamed")
        unbind_request(token)
        logger.info("outside")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["request_id"] for line in lines] == ["rid-1", "rid-2", None]
    assert lines[0]["latency_ms"] == 1.5 and lines[0]["prompt_tokens"] == 3 and "unlisted" not in lines[0]
    assert {"timestamp", "level", "logger", "message"} <= set(lines[0])
