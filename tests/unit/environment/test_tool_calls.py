"""The tool-call format and the calculator (pure logic; the python tool runs in the sandbox and is tested
with it in tests/integration/test_tool_use.py)."""

from __future__ import annotations

import pytest

from scalerl.config import SpecError, spec_from_dict
from scalerl.environment.tools import Toolbox, ToolCall, parse_call


@pytest.mark.parametrize(("text", "call"), [
    ('think first <tool name="python">\nprint(1)\n</tool>', ToolCall("python", "print(1)")),
    ('<tool name = "calculator" >12*(3+4)</tool>\n', ToolCall("calculator", "12*(3+4)")),
    # the last call of the turn is the one it ends with
    ('<tool name="calculator">1+1</tool> then <tool name="python">\nx = 2\nprint(x)\n</tool>',
     ToolCall("python", "x = 2\nprint(x)")),
])
def test_a_turn_ending_on_a_call_gives_that_call(text, call):
    assert parse_call(text) == call


@pytest.mark.parametrize("text", [
    "no call at all</tool>",
    "<tool>print(1)</tool>",  # no name
    '<tool name="python">print(1)',  # not closed
    '<tool name="python">print(1)</tool> and more',  # the turn does not end on it
])
def test_a_turn_without_a_whole_call_gives_none(text):
    assert parse_call(text) is None


def test_the_calculator_is_exact_and_refuses_what_is_not_arithmetic():
    box = Toolbox(("calculator",))
    assert box.run(ToolCall("calculator", "12*(3+4) - 5")) == "79"
    assert box.run(ToolCall("calculator", "7/2")) == "7/2"
    assert box.run(ToolCall("calculator", "9/3")) == "3"
    for bad in ("2**3", "__import__('os')", "1/0", ""):
        assert box.run(ToolCall("calculator", bad)).startswith("error: "), bad


def test_unknown_tools_and_malformed_calls_are_answered_with_the_tools_list():
    box = Toolbox(("calculator",))
    assert box.run(ToolCall("python", "print(1)")) == "error: unknown tool 'python'; tools: calculator"
    assert box.run(None).startswith('error: a call is <tool name="NAME">INPUT</tool>; tools: calculator')


def test_the_instructions_name_each_tool_and_the_format():
    text = Toolbox(("python", "calculator")).instructions()
    assert "- python:" in text and "- calculator:" in text and '<tool name="NAME">' in text and "<result>" in text


def test_a_toolbox_takes_only_known_tools():
    with pytest.raises(ValueError, match="allowed: python, calculator"):
        Toolbox(("shell",))
    with pytest.raises(ValueError, match="none given"):
        Toolbox(())


def test_the_spec_names_each_bad_environment_field():
    with pytest.raises(SpecError) as err:
        spec_from_dict({"environment": {"tools": ["python", "shell"], "max_turns": 0}})
    text = str(err.value)
    assert "environment.tools" in text and "environment.max_turns" in text
    with pytest.raises(SpecError, match="names a tool twice"):
        spec_from_dict({"environment": {"tools": ["python", "python"]}})
    assert spec_from_dict({"environment": {"tools": ["calculator"]}}).environment.tools == ["calculator"]


@pytest.mark.parametrize(("env", "line"), [
    ({"tools": ["python"], "service": "dns:///env:notaport"},
     "environment.service: 'dns:///env:notaport': port 'notaport' is not a number 1-65535; allowed: dns:///HOST:PORT"),
    ({"tools": ["python"], "service": "unix:/run/env.sock"},
     "environment.service: 'unix:/run/env.sock': unknown scheme"),
    ({"service": "env:7000"}, "environment: service: 'env:7000' set, but tools is empty"),
])
def test_the_environment_service_must_be_a_target_and_needs_tools(env, line):
    with pytest.raises(SpecError) as err:
        spec_from_dict({"environment": env})
    assert line in str(err.value)


def test_the_environment_service_takes_every_target_form():
    for target in ("dns:///j-environment.team.svc:50051", "ipv4:127.0.0.1:5001,127.0.0.1:5002", "env-0:50051"):
        assert spec_from_dict({"environment": {"tools": ["python"], "service": target}}).environment.service == target
