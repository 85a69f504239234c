"""The two OpenAI endpoint kinds as types: `CHAT` (`/v1/chat/completions`) and `TEXT`
(`/v1/completions`). Each owns what differs between them: how its body is parsed, how its
job is built, how a full response and each stream chunk are written from the replica's wire
events. `responses.py` drives them; nothing else asks which kind a request is.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from loraplex.platform.gateway import openai_schemas as oa
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.gateway.chunk_parts import TextHoles, chat_logprobs, text_logprobs
from loraplex.platform.gateway.completion import (
    Job,
    check_prompt_length,
    max_tokens_for,
    sampling_for,
    wire_request,
)
from loraplex.platform.gateway.errors import bad_request
from loraplex.platform.gateway.openai_structured import request_constraints
from loraplex.platform.gateway.resolve import ResolvedModel
from loraplex.platform.gateway.streaming import sse
from loraplex.platform.gateway.tool_outputs import ToolStream, reads_tool_calls, tool_calls_of
from loraplex.platform.tokenizing import TemplateRenderError
from loraplex.platform.wire import DeltaEvent


def build_chat_job(
    body: oa.ChatCompletionRequest,
    resolved: ResolvedModel,
    assets: ModelAssets,
    tenant_id: uuid.UUID,
    api_key_id: uuid.UUID | None,
    default_max_tokens: int,
    model: str | None = None,
    cache_salt: str | None = None,
) -> Job:
    """Render the conversation, tokenize it and check limits (`model`: the name the caller
    used, when it is not the body's; `cache_salt`: the tenant's prefix-cache partition)."""
    tok = assets.tokenizer
    constraints = request_constraints(
        body, tok.vocab_size, tok.template.source, resolved.tool_call_format
    )
    tools = constraints.tools.template_tools() if constraints.tools else None
    messages = [m.template_dict() for m in body.messages]
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    except TemplateRenderError as exc:
        raise bad_request(exc.message, param="messages") from None
    check_prompt_length(text, assets, body.requested_max_tokens(), "messages")
    ids = assets.tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise bad_request("The rendered conversation is empty.", param="messages")
    max_tokens = max_tokens_for(
        body.requested_max_tokens(), len(ids), assets.context_length, default_max_tokens, "messages"
    )
    top_n = (body.top_logprobs or 0) if body.logprobs else None
    sampling = sampling_for(body, max_tokens, top_n, constraints)
    cid = oa.new_id("chatcmpl")
    job = Job(
        CHAT,
        model or body.model,
        resolved,
        wire_request(cid, ids, sampling, resolved, tenant_id, cache_salt),
        max_tokens,
        body.n,
        top_n,
        tenant_id,
        api_key_id,
        body.stream,
        body.include_usage,
        cid=cid,
    )
    job.tools = constraints.tools
    return job


def build_text_job(
    body: oa.CompletionRequest,
    resolved: ResolvedModel,
    assets: ModelAssets,
    tenant_id: uuid.UUID,
    api_key_id: uuid.UUID | None,
    default_max_tokens: int,
    model: str | None = None,
    cache_salt: str | None = None,
) -> Job:
    """Tokenize the prompt (or check the given ids) and check limits."""
    constraints = request_constraints(body, assets.tokenizer.vocab_size, None)
    prompt = body.prompt_text_or_ids()
    if isinstance(prompt, str):
        check_prompt_length(prompt, assets, body.requested_max_tokens(), "prompt")
        ids = assets.tokenizer.encode(prompt, add_special_tokens=True)
        if not ids:
            raise bad_request("The prompt is empty.", param="prompt")
    else:
        vocab = assets.tokenizer.vocab_size
        if not prompt:
            raise bad_request("The prompt is empty.", param="prompt")
        if any(t < 0 or t >= vocab for t in prompt):
            raise bad_request(f"Prompt token ids must be in [0, {vocab}).", param="prompt")
        ids = prompt
    max_tokens = max_tokens_for(
        body.requested_max_tokens(), len(ids), assets.context_length, default_max_tokens, "prompt"
    )
    sampling = sampling_for(body, max_tokens, body.logprobs, constraints)
    cid = oa.new_id("cmpl")
    return Job(
        TEXT,
        model or body.model,
        resolved,
        wire_request(cid, ids, sampling, resolved, tenant_id, cache_salt),
        max_tokens,
        body.n,
        body.logprobs,
        tenant_id,
        api_key_id,
        body.stream,
        body.include_usage,
        cid=cid,
    )


class StreamWriter(Protocol):
    """One stream's SSE frames, written from wire events (state kept per stream)."""

    def opening(self) -> bytes:
        """Frames sent before the first event (the chat role chunks)."""
        ...

    def frame(self, index: int, delta: DeltaEvent | None, finish: str | None) -> bytes:
        """The frames of one event of choice `index`: new output, or its finish reason."""
        ...


class Endpoint(Protocol):
    """What differs between the chat and the text completions endpoints."""

    @property
    def name(self) -> str:
        """ "chat" or "text" (logs and metrics)."""
        ...

    @property
    def chunk_object(self) -> str:
        """The `object` of its stream chunks."""
        ...

    def parse(self, body: oa.BodyInput, adapter: str | None = None) -> Any:
        """The validated request model of a body, from its bytes (400 on bad JSON or fields);
        `adapter`: the model when the body names none (per-adapter routes)."""
        ...

    def build_job(
        self,
        body: Any,
        resolved: ResolvedModel,
        assets: ModelAssets,
        tenant_id: uuid.UUID,
        api_key_id: uuid.UUID | None,
        default_max_tokens: int,
        model: str,
        cache_salt: str | None = None,
    ) -> Job:
        """Render, tokenize and check limits: the job to dispatch, carrying the wire request
        its choices are sent as (`cache_salt`: the tenant's prefix-cache partition)."""
        ...

    def response(
        self, job: Job, per_choice: dict[int, list[DeltaEvent]], finishes: dict[int, str],
        usage: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        """The full (non-streamed) response object."""
        ...

    def stream_writer(self, job: Job) -> StreamWriter:
        """A writer of this job's SSE frames."""
        ...


def _text(deltas: list[DeltaEvent]) -> str:
    return "".join(d.text for d in deltas)


@dataclass(frozen=True)
class _Kind:
    """What both kinds do alike, through the functions each is built with."""

    name: str
    chunk_object: str
    parse_body: Callable[[oa.BodyInput, str | None], Any]
    build: Callable[..., Job]

    def parse(self, body: oa.BodyInput, adapter: str | None = None) -> Any:
        return self.parse_body(body, adapter)

    def build_job(self, body: Any, resolved: ResolvedModel, assets: ModelAssets,
                  tenant_id: uuid.UUID, api_key_id: uuid.UUID | None, default_max_tokens: int,
                  model: str, cache_salt: str | None = None) -> Job:  # fmt: skip
        return self.build(
            body, resolved, assets, tenant_id, api_key_id, default_max_tokens, model, cache_salt
        )


@dataclass(frozen=True)
class _Chat(_Kind):
    def response(
        self, job: Job, per_choice: dict[int, list[DeltaEvent]], finishes: dict[int, str],
        usage: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        choices = []
        for i, got in per_choice.items():
            finish, text = finishes.get(i, "stop"), _text(got)
            lps = (
                [e for d in got for e in chat_logprobs(d.logprobs)]
                if job.top_n is not None
                else None
            )
            choice: dict[str, Any] = {
                "index": i,
                "text": text,
                "logprobs": lps,
                "finish_reason": finish,
            }
            if job.tools is not None and reads_tool_calls(job.tools) and finish == "stop":
                content, calls = tool_calls_of(job.tools, text)
                if calls:
                    choice.update(text=content, tool_calls=calls, finish_reason="tool_calls")
            choices.append(choice)
        return oa.chat_completion(job.cid, job.created, job.model, choices, usage)

    def stream_writer(self, job: Job) -> StreamWriter:
        return _ChatStream(job)


class _ChatStream:
    """Chat chunks: a role chunk per choice, content deltas, tool-call deltas when the
    request has tools to read from the output (logprobs then ride on the last chunk)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        plan = job.tools
        self.tools = (
            {i: ToolStream(plan) for i in range(job.n)}
            if plan is not None and reads_tool_calls(plan)
            else {}
        )
        self.held: dict[int, list[dict[str, Any]]] = {i: [] for i in range(job.n)}
        self.holes = TextHoles()

    def _content_chunk(self, index: int, text: str) -> bytes:
        return self._chunk(index, {"content": text})

    def _chunk(self, index: int, delta: dict[str, Any], **kw: Any) -> bytes:
        j = self.job
        return sse(oa.chat_chunk(j.cid, j.created, j.model, index, delta,
                                 with_usage_field=j.include_usage, **kw))  # fmt: skip

    def opening(self) -> bytes:
        return b"".join(
            self._chunk(i, {"role": "assistant", "content": ""}) for i in range(self.job.n)
        )

    def frame(self, index: int, delta: DeltaEvent | None, finish: str | None) -> bytes:
        text = delta.text if delta is not None else ""
        if text and finish is None and self.job.top_n is None and index not in self.tools:
            return self.holes.fill(index, text, self._content_chunk)
        lps = chat_logprobs(delta.logprobs) if delta is not None else []
        if index in self.tools:
            return self._tool_frames(index, text, lps, finish)
        if not text and finish is None and not lps:
            return b""
        content = {"content": text} if text or finish is None else {}
        shown = lps if self.job.top_n is not None else None
        return self._chunk(index, content, logprobs=shown, finish_reason=finish)

    def _tool_frames(
        self, index: int, text: str, lps: list[dict[str, Any]], finish: str | None
    ) -> bytes:
        ts = self.tools[index]
        if self.job.top_n is not None:
            self.held[index] += lps
        out = [self._chunk(index, d) for d in ts.deltas(text)]
        if finish is not None:
            deltas, reason = ts.finish(finish)
            out += [self._chunk(index, d) for d in deltas]
            held = self.held[index] if self.job.top_n is not None else None
            out.append(self._chunk(index, {}, logprobs=held, finish_reason=reason))
        return b"".join(out)


@dataclass(frozen=True)
class _Text(_Kind):
    def response(
        self, job: Job, per_choice: dict[int, list[DeltaEvent]], finishes: dict[int, str],
        usage: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        choices = [
            {
                "index": i,
                "text": _text(got),
                "logprobs": text_logprobs(got) if job.top_n is not None else None,
                "finish_reason": finishes.get(i, "stop"),
            }
            for i, got in per_choice.items()
        ]
        return oa.text_completion(job.cid, job.created, job.model, choices, usage)

    def stream_writer(self, job: Job) -> StreamWriter:
        return _TextStream(job)


class _TextStream:
    """Text chunks; logprob `text_offset`s continue across a choice's chunks."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.offsets = [0] * job.n
        self.holes = TextHoles()

    def _content_chunk(self, index: int, text: str) -> bytes:
        return self._chunk(index, text, None, None)

    def _chunk(
        self, index: int, text: str, lps: dict[str, Any] | None, finish: str | None
    ) -> bytes:
        j = self.job
        return sse(oa.text_chunk(j.cid, j.created, j.model, index, text, logprobs=lps,
                                 finish_reason=finish, with_usage_field=j.include_usage))  # fmt: skip

    def opening(self) -> bytes:
        return b""

    def frame(self, index: int, delta: DeltaEvent | None, finish: str | None) -> bytes:
        text = delta.text if delta is not None else ""
        has_lps = delta is not None and bool(delta.logprobs)
        if not text and finish is None and not has_lps:
            return b""
        if self.job.top_n is None:
            return (
                self.holes.fill(index, text, self._content_chunk)
                if finish is None
                else self._chunk(index, text, None, finish)
            )
        lps = text_logprobs([delta] if delta is not None else [], self.offsets[index])
        self.offsets[index] += len(text)
        return self._chunk(index, text, lps, finish)


CHAT: Endpoint = _Chat("chat", "chat.completion.chunk", oa.parse_chat_request, build_chat_job)
TEXT: Endpoint = _Text("text", "text_completion", oa.parse_completion_request, build_text_job)

__all__ = ["CHAT", "TEXT", "Endpoint", "StreamWriter", "build_chat_job", "build_text_job"]
