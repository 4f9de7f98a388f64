"""Finding the tool calls in a model's turn, in the chat template's tool-call format.

A parser is registered by name in ``TOOL_PARSERS`` (``actor_rollout_ref.rollout.multi_turn.format``,
verl's key; "hermes" built in). It works on the decoded text of one assistant turn and returns the text
without the calls, the well-formed calls, and one typed :class:`ToolCallError` per malformed call. The
agent loop answers each error with a tool-response message saying what was wrong, so the model sees
its mistake and the step goes on; it never raises for what the model wrote.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from verl.core.registry import Registry


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class ToolCallError(ValueError):
    """A malformed tool call. ``str(error)`` is the message the model gets back as the tool response."""

    def __init__(self, message: str, raw: str):
        super().__init__(message)
        self.raw = raw


class UnclosedToolCallError(ToolCallError):
    """An opening tag without its closing tag."""


class InvalidToolCallJSONError(ToolCallError):
    """The text between the tags is not JSON, or not a JSON object."""


class MissingToolNameError(ToolCallError):
    """The call's object has no ``name`` string."""


class BadToolArgumentsError(ToolCallError):
    """``arguments`` is neither a JSON object nor a string holding one."""


@dataclass
class ParsedTurn:
    #: The turn's text with every tool-call block taken out (stripped).
    text: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)


class ToolParser(Protocol):
    def parse(self, text: str) -> ParsedTurn: ...


TOOL_PARSERS: Registry[type] = Registry("tool-call parser")


@TOOL_PARSERS.register("hermes")
class HermesToolParser:
    """Hermes/Qwen style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of
    blocks anywhere in the turn."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self) -> None:
        self._block = re.compile(re.escape(self.open_tag) + r"(.*?)" + re.escape(self.close_tag), re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        parsed = ParsedTurn(text="")
        pieces: list[str] = []
        position = 0
        for match in self._block.finditer(text):
            pieces.append(text[position : match.start()])
            position = match.end()
            self._add(parsed, match.group(1))
        rest = text[position:]
        if self.open_tag in rest:
            before, _, after = rest.partition(self.open_tag)
            pieces.append(before)
            parsed.errors.append(
                UnclosedToolCallError(
                    f"Error: a tool call was opened with {self.open_tag} but never closed with {self.close_tag}; "
                    f'write each call as {self.open_tag}{{"name": ..., "arguments": {{...}}}}{self.close_tag}.',
                    raw=self.open_tag + after,
                )
            )
        else:
            pieces.append(rest)
        parsed.text = "".join(pieces).strip()
        return parsed

    def _add(self, parsed: ParsedTurn, body: str) -> None:
        try:
            parsed.calls.append(parse_call_object(body))
        except ToolCallError as error:
            parsed.errors.append(error)


def parse_call_object(body: str) -> ToolCall:
    """One call's JSON ``{"name": str, "arguments": object}``; ``arguments`` may also be a string holding
    a JSON object (the OpenAI wire format) or absent (no arguments)."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as e:
        raise InvalidToolCallJSONError(
            f"Error: the tool call is not valid JSON ({e.msg} at position {e.pos}).", body
        ) from None
    if not isinstance(payload, dict):
        raise InvalidToolCallJSONError(
            f"Error: a tool call must be a JSON object with name and arguments, got {type(payload).__name__}.", body
        )
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        raise MissingToolNameError('Error: the tool call has no "name" (a non-empty string naming the tool).', body)
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise BadToolArgumentsError(
                f'Error: the "arguments" of {name} is a string that is not JSON.', body
            ) from None
    if not isinstance(arguments, dict):
        raise BadToolArgumentsError(
            f'Error: the "arguments" of {name} must be a JSON object, got {type(arguments).__name__}.', body
        )
    return ToolCall(name=name, arguments=arguments)


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered as ``name`` (``multi_turn.format``)."""
    return TOOL_PARSERS.get(name)()
