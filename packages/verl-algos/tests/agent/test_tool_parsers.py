"""Hermes tool-call parsing: good calls, and one typed error per kind of malformed call."""

import pytest

from verl.algos.agent.tool_parsers import (
    TOOL_PARSERS,
    BadToolArgumentsError,
    InvalidToolCallJSONError,
    MissingToolNameError,
    ToolCall,
    UnclosedToolCallError,
    get_tool_parser,
)
from verl.core.registry import RegistryError


@pytest.fixture
def hermes():
    return get_tool_parser("hermes")


def test_text_without_calls_is_returned_whole(hermes):
    parsed = hermes.parse("The answer is 42.")
    assert parsed.text == "The answer is 42." and parsed.calls == [] and parsed.errors == []


def test_one_call_and_surrounding_text(hermes):
    parsed = hermes.parse(
        'Let me add.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2+3"}}\n</tool_call>'
    )
    assert parsed.calls == [ToolCall("calc", {"expression": "2+3"})]
    assert parsed.text == "Let me add." and parsed.errors == []


def test_several_calls_in_order_and_arguments_as_json_string(hermes):
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
    )
    parsed = hermes.parse(text)
    assert parsed.calls == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": [1, 2]}), ToolCall("c", {})]
    assert parsed.text == "and"


def test_unclosed_tag(hermes):
    parsed = hermes.parse('ok <tool_call>{"name": "calc", "arguments": {}}')
    assert parsed.calls == [] and parsed.text == "ok"
    [error] = parsed.errors
    assert isinstance(error, UnclosedToolCallError) and "never closed" in str(error)
    assert error.raw.startswith("<tool_call>")


@pytest.mark.parametrize("body", ['{"name": "calc", "arguments": {', "not json", ""])
def test_invalid_json(hermes, body):
    [error] = hermes.parse(f"<tool_call>{body}</tool_call>").errors
    assert isinstance(error, InvalidToolCallJSONError) and "not valid JSON" in str(error)


def test_json_that_is_not_an_object(hermes):
    [error] = hermes.parse("<tool_call>[1, 2]</tool_call>").errors
    assert isinstance(error, InvalidToolCallJSONError) and "list" in str(error)


@pytest.mark.parametrize("body", ['{"arguments": {}}', '{"name": "", "arguments": {}}', '{"name": 3}'])
def test_missing_name(hermes, body):
    [error] = hermes.parse(f"<tool_call>{body}</tool_call>").errors
    assert isinstance(error, MissingToolNameError) and '"name"' in str(error)


@pytest.mark.parametrize("arguments", ["[1]", "3", '"not json"', '"[1]"', "null"])
def test_arguments_not_an_object(hermes, arguments):
    [error] = hermes.parse(f'<tool_call>{{"name": "calc", "arguments": {arguments}}}</tool_call>').errors
    assert isinstance(error, BadToolArgumentsError) and "calc" in str(error)


def test_good_and_bad_calls_together_keep_the_good_ones(hermes):
    parsed = hermes.parse('<tool_call>{"name": "a"}</tool_call><tool_call>oops</tool_call><tool_call>{"name": "b"}')
    assert parsed.calls == [ToolCall("a", {})]
    assert [type(e) for e in parsed.errors] == [InvalidToolCallJSONError, UnclosedToolCallError]


def test_unknown_format_lists_the_registered_ones():
    assert "hermes" in TOOL_PARSERS
    with pytest.raises(RegistryError, match="hermes"):
        get_tool_parser("hermez")
