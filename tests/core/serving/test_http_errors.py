"""A 400 names the field as the client sent it, in plain words: never pydantic's own tags
(`prompt.constrained-str`, `list[constrained-str]`), never "not a valid string" for a list
that holds an empty string."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from aieng_core.serving.http.api_models import CompletionRequest, GenerateRequest, PredictRequest
from aieng_core.serving.http.errors import validation_error


@pytest.mark.parametrize(
    ("model", "body", "param", "message"),
    [
        (GenerateRequest, {"prompt": ""}, "prompt", "prompt: must not be empty"),
        (CompletionRequest, {"prompt": ""}, "prompt", "prompt: must not be empty"),
        (CompletionRequest, {"prompt": ["a", ""]}, "prompt", "prompt.1: must not be empty"),
        (CompletionRequest, {"prompt": 5}, "prompt", "prompt: should be a valid string or a valid list"),
        (CompletionRequest, {"prompt": "a", "stop": ""}, "stop", "stop: must not be empty"),
        (CompletionRequest, {"prompt": "a", "stop": ["x", ""]}, "stop", "stop.1: must not be empty"),
        (PredictRequest, {"inputs": [""]}, "inputs", "inputs.0: must not be empty"),
        (
            GenerateRequest,
            {"prompt": "a", "max_new_tokens": "3"},
            "max_new_tokens",
            "max_new_tokens: expected a number, got str '3'",
        ),
        (GenerateRequest, {"prompt": "a", "bogus": 1}, "bogus", "unknown field 'bogus'"),
    ],
)
def test_the_message_names_the_field_in_plain_words(
    model: type[BaseModel], body: dict, param: str, message: str
) -> None:
    with pytest.raises(ValidationError) as invalid:
        model.model_validate(body)
    error = validation_error(invalid.value.errors())
    assert (error.status, error.param, error.message) == (400, param, message)
    assert "constrained" not in error.message and "[" not in error.message
