"""The HTTP API's request and response bodies as pydantic models, free of any web framework.

Every request model forbids unknown fields and bounds every value: a typo'd parameter that a
server silently ignores is how evaluation harnesses get wrong numbers against it. OpenAI
parameters we do not implement are accepted only at their neutral value (best_of 1, suffix
null, no tools, ...) and are otherwise refused with an error naming them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from aieng_core.serving.request import MAX_LOGPROBS, FinishReason, SamplingParams

# Bounds that keep one request from asking the server for unbounded work or memory; the
# engine's own limits (max_context) are checked by the engine and named in its error.
MAX_PROMPT_CHARS = 1_000_000
MAX_NEW_TOKENS = 1 << 20
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1 << 20
MAX_SEED = (1 << 63) - 1
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_PREDICT_INPUTS = 256
MAX_ID_CHARS = 128

# Request ids travel in headers and log lines: a conservative alphabet keeps both clean.
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:\-/]{1,128}$"

RequestId = Annotated[str, StringConstraints(pattern=REQUEST_ID_PATTERN)]
Prompt = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PROMPT_CHARS)]
# A prompt given as token ids (OpenAI's, and vLLM's, other prompt form); the engine checks each
# against the vocabulary and the whole against max_context.
MAX_PROMPT_IDS = 1 << 20
TOKEN_ID_KEY = re.compile(r"[0-9]{1,12}")  # a logit_bias key
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1, max_length=MAX_PROMPT_IDS)]
StopString = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]


def json_number(value: Any) -> Any:
    """A number field's input, refused where pydantic's lax mode would read a number into it
    (true as 1, "16" as 16): the API takes what its OpenAPI document says. A float without a
    fraction (16.0) is still an integer, as JSON Schema has it. Booleans are StrictBool."""
    if isinstance(value, bool | str):
        raise ValueError(f"expected a number, got {type(value).__name__} {value!r}")
    return value


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


class RequestDefaults(_Body):
    """Values used where a request leaves a sampling field out: the bundle's own (serving.json,
    from the bundle: config section, the one place they are set), never a fallback here."""

    max_new_tokens: int = Field(ge=1)
    temperature: float = Field(ge=0.0)
    top_k: int = Field(ge=0)
    top_p: float = Field(gt=0.0, le=1.0)

    @classmethod
    def of_bundle(cls, serving: dict[str, Any]) -> RequestDefaults:
        """From a bundle's serving.json (bundle/verify.py checked it carries every one)."""
        return cls(
            max_new_tokens=serving["default_max_new_tokens"],
            temperature=serving["default_temperature"],
            top_k=serving["default_top_k"],
            top_p=serving["default_top_p"],
        )


class SamplingOptions(_Body):
    """The sampling fields /generate and /predict share; None means the server's default."""

    max_new_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(default=None, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOP_K)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: list[StopString] | None = Field(default=None, max_length=MAX_STOP_STRINGS)
    ignore_eos: StrictBool = False

    @field_validator("max_new_tokens", "temperature", "top_k", "top_p", "seed", mode="before")
    @classmethod
    def _numbers_only(cls, value: Any) -> Any:
        return json_number(value)

    def sampling_params(self, defaults: RequestDefaults) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=defaults.max_new_tokens if self.max_new_tokens is None else self.max_new_tokens,
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=tuple(self.stop or ()),
            ignore_eos=self.ignore_eos,
        )


class GenerateRequest(SamplingOptions):
    prompt: Prompt
    request_id: RequestId | None = None


class GenerateResponse(_Response):
    request_id: str
    text: str
    tokens: int  # how many tokens were generated
    token_ids: list[int]
    finish_reason: FinishReason
    latency_ms: float
    prompt_tokens: int


class PredictRequest(_Body):
    inputs: list[Prompt] = Field(min_length=1, max_length=MAX_PREDICT_INPUTS)
    options: SamplingOptions = SamplingOptions()
    request_id: RequestId | None = None


class PredictOutput(_Response):
    text: str
    tokens: int
    finish_reason: FinishReason


class PredictResponse(_Response):
    request_id: str
    outputs: list[PredictOutput]
    latency_ms: float


class StreamOptions(_Body):
    include_usage: StrictBool | None = None
    # vLLM's extension: usage in every chunk. Accepted only at its neutral value.
    continuous_usage_stats: StrictBool | None = None

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_continuous_usage(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("continuous_usage_stats is not supported")
        return value


def _unsupported(name: str | None, value: Any) -> ValueError:
    return ValueError(f"{name}={value!r} is not supported by this server")


class _OpenAIRequest(_Body):
    """What /v1/completions and /v1/chat/completions share, as OpenAI defines it (with vLLM's
    top_k and ignore_eos)."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    temperature: float | None = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    # vLLM: -1 (or 0) means no top-k cut.
    top_k: int | None = Field(default=None, ge=-1, le=MAX_TOP_K)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    stop: StopString | list[StopString] | None = Field(default=None)
    seed: int | None = Field(default=None, ge=-(1 << 63), le=MAX_SEED)
    user: Annotated[str, StringConstraints(max_length=256)] | None = None
    ignore_eos: StrictBool | None = False
    request_id: RequestId | None = None
    # OpenAI's penalties and logit_bias (keys: token ids as strings), applied as vLLM applies
    # them: on the logits of each step, the penalties counting the request's output tokens.
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    # Choices per prompt: the prompt is prefilled once, and each sample decodes in its own slot.
    n: int | None = Field(default=1, ge=1, le=128)
    logit_bias: (
        dict[Annotated[str, StringConstraints(max_length=12)], Annotated[float, Field(ge=-100, le=100)]] | None
    ) = Field(default=None, max_length=1024)

    @field_validator(
        "temperature", "top_p", "top_k", "seed", "n", "presence_penalty", "frequency_penalty", mode="before"
    )
    @classmethod
    def _numbers_only(cls, value: Any) -> Any:
        return json_number(value)

    @field_validator("stop")
    @classmethod
    def _stop_bounded(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(value)}")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_by_token_id(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        # OpenAI's keys are token ids as strings of ASCII digits ("²".isdigit() is True, and
        # int() refuses it); two spellings of one id ("1", "01") would add up unseen.
        ids: set[int] = set()
        for key in value or {}:
            if not TOKEN_ID_KEY.fullmatch(key):
                raise ValueError(f"keys are token ids (non-negative integers as strings), got {key!r}")
            if int(key) in ids:
                raise ValueError(f"token id {int(key)} is given twice")
            ids.add(int(key))
        return value

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def samples(self) -> int:
        return self.n if self.n is not None else 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def engine_logprobs(self) -> int | None:
        """SamplingParams.logprobs as this request asks for them."""
        return None

    def sampling_params_for(self, max_new_tokens: int) -> SamplingParams:
        # OpenAI's seed is any 64-bit integer; our generators take a non-negative one.
        seed = None if self.seed is None else self.seed % (1 << 63)
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature if self.temperature is not None else 1.0,
            top_k=max(self.top_k, 0) if self.top_k is not None else 0,
            top_p=self.top_p if self.top_p is not None else 1.0,
            seed=seed,
            stop=self.stop_strings,
            ignore_eos=bool(self.ignore_eos),
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=tuple(sorted((int(token), float(value)) for token, value in (self.logit_bias or {}).items())),
            logprobs=self.engine_logprobs,
        )


class CompletionRequest(_OpenAIRequest):
    """POST /v1/completions."""

    # Text, a list of texts, token ids, or a list of token-id lists: one choice per prompt.
    prompt: Prompt | list[Prompt] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(default=16, ge=1, le=MAX_NEW_TOKENS)
    best_of: int | None = Field(default=None, ge=1, le=128)
    # The chosen token's log-probability and this many top ones per step (0: the chosen one's only).
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool | None = False  # the prompt before each choice's text
    suffix: Annotated[str, StringConstraints(max_length=MAX_PROMPT_CHARS)] | None = None

    @field_validator("max_tokens", "best_of", "logprobs", mode="before")
    @classmethod
    def _own_numbers_only(cls, value: Any) -> Any:
        return json_number(value)

    @field_validator("prompt")
    @classmethod
    def _prompt_list_bounded(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("a prompt list holds at least one prompt")
        if isinstance(value, list) and not isinstance(value[0], int) and len(value) > MAX_PREDICT_INPUTS:
            raise ValueError(f"a prompt list holds 1 to {MAX_PREDICT_INPUTS} prompts, got {len(value)}")
        return value

    @field_validator("best_of")
    @classmethod
    def _single_best(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value > 1:
            raise _unsupported(info.field_name, value)
        return value

    @field_validator("suffix")
    @classmethod
    def _must_be_null(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise _unsupported(info.field_name, value)
        return value

    @field_validator("echo")
    @classmethod
    def _no_prompt_logprobs(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        # With echo, OpenAI's logprobs cover the prompt's tokens too: the prefill computes the
        # logits of each prompt's last token only.
        if value and info.data.get("logprobs") is not None:
            raise ValueError("echo with logprobs (log-probabilities of the prompt's tokens) is not supported")
        return value

    @property
    def engine_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("best_of")
    @classmethod
    def _best_of_at_least_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n")
        if value is not None and n is not None and value < n:
            raise ValueError(f"best_of ({value}) must be at least n ({n}), as OpenAI requires")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt (n choices each): a text or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)

    def sampling_params(self) -> SamplingParams:
        return self.sampling_params_for(self.max_tokens if self.max_tokens is not None else 16)


MAX_MESSAGES = 1024


class TextPart(_Body):
    """A content part of a chat message: text only (this server reads no images or audio)."""

    type: Literal["text"]
    text: Annotated[str, StringConstraints(max_length=MAX_PROMPT_CHARS)]


# OpenAI's roles ("function" is deprecated there). Which of them a conversation may use is the
# chat template's to judge (the default one takes system, user and assistant), as vLLM leaves it.
ChatRole = Literal["system", "developer", "user", "assistant", "tool"]


class ChatMessage(_Body):
    """One message of a conversation."""

    role: ChatRole
    content: Annotated[str, StringConstraints(max_length=MAX_PROMPT_CHARS)] | list[TextPart]
    name: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None

    def for_template(self) -> dict[str, str]:
        """As the template reads it: text parts joined by newlines (vLLM's "string" content format)."""
        content = self.content if isinstance(self.content, str) else "\n".join(part.text for part in self.content)
        message = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        return message


class ResponseFormat(_Body):
    type: Literal["text"]


class ChatCompletionRequest(_OpenAIRequest):
    """POST /v1/chat/completions. With neither max_completion_tokens nor max_tokens, the
    reply may run to the end of the context, as vLLM does."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)  # OpenAI's older name
    # vLLM's: end the prompt with the template's opening of an assistant reply.
    add_generation_prompt: StrictBool = True
    # The chosen token's log-probability, with top_logprobs of the most likely ones per step.
    logprobs: StrictBool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # Parameters of the OpenAI API this server does not implement: neutral values only.
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: StrictBool | None = None

    @field_validator("max_completion_tokens", "max_tokens", "top_logprobs", mode="before")
    @classmethod
    def _own_numbers_only(cls, value: Any) -> Any:
        return json_number(value)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_with_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs to be true, as OpenAI requires")
        return value

    @property
    def engine_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value:
            raise _unsupported("tools", "[...]")
        return value

    @property
    def asked_tokens(self) -> tuple[str, int] | None:
        """The output bound the request named, and the field it named it in."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        if self.max_tokens is not None:
            return "max_tokens", self.max_tokens
        return None

    @property
    def engine_names(self) -> dict[str, str]:
        """The engine's field names as this request spells them in errors: the output bound as
        it was named, the prompt as the messages it was rendered from."""
        asked = self.asked_tokens
        return {"max_new_tokens": asked[0] if asked is not None else "max_completion_tokens", "prompt": "messages"}

    def conversation(self) -> list[dict[str, str]]:
        return [message.for_template() for message in self.messages]


OpenAIFinishReason = Literal["stop", "length"]


class CompletionLogprobs(_Response):
    """The legacy completions shape (logprobs.py)."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[ChatTokenLogprob] | None
    refusal: None = None


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: OpenAIFinishReason | None


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatReply(_Response):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Response):
    index: int
    message: ChatReply
    logprobs: ChatLogprobs | None = None
    finish_reason: OpenAIFinishReason | None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: OpenAIFinishReason | None


class ChatCompletionChunk(_Response):
    """One event of a streamed chat completion (declared in the OpenAPI document only)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "aieng"


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ReloadRequest(_Body):
    bundle: Annotated[str, StringConstraints(min_length=1, max_length=4096)]


# The bodies below are declared in the OpenAPI document only (the handlers return dicts):
# they describe what the server answers and never filter it.


class ReloadResponse(_Response):
    bundle_id: str
    previous_bundle_id: str | None
    bundle_path: str
    warmup: dict[str, Any]


class LiveStatus(_Response):
    status: Literal["live"]


class DeploymentMismatch(_Response):
    """The pointer names a bundle this server refused; it keeps serving another (or none)."""

    pointer_bundle: str | None
    served_bundle: str | None
    reason: str | None


class DeploymentInfo(_Response):
    """The deployment pointer a server follows (`aieng serve --deployment current`)."""

    pointer: str
    bundle_id: str | None
    sequence: int
    refused: bool
    mismatch: DeploymentMismatch | None


class ReadyStatus(_Response):
    status: Literal["ready"]
    bundle_id: str
    deployment: DeploymentInfo | None = None


class VersionInfo(_Response):
    bundle_id: str
    data_version: str
    bundle_path: str
    deployment: DeploymentInfo | None
    code_version: str | None
    created_at: str | None
    git_commit: str | None
    server_version: str
    inputs: list[dict[str, Any]]
    lineage: dict[str, Any] | None
    weights: str


class ErrorDetail(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorBody(_Response):
    error: ErrorDetail


def error_body(message: str, type_: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    return ErrorBody(error=ErrorDetail(message=message, type=type_, param=param, code=code)).model_dump()
