"""The tools a model may call in an episode, the call format, and how a call becomes an observation.

Format (told to the model by `Toolbox.instructions`, appended to every prompt of a job with tools):

    <tool name="python">
    print(sum(range(10)))
    </tool>

A turn ends on the token that completes `</tool>` (any of its token spellings: an engine stop sequence,
`scalerl.generator.engine.LengthControl.stop_sequences`). The call is the last `<tool name="...">` of the
turn and the text up to `</tool>`; the environment answers with

    <result>
    45
    </result>

whose tokens join the sequence with loss mask False (`scalerl.generator.episode`). Calls are allowed
while the model thinks (before `</think>`); the answer after it is final.

Tools:
- `python`: the call's text is a Python program, run in the sandbox (`scalerl.sandbox.run_python`: its own
  process, no network, a private temp dir, CPU, wall, memory, process and output limits); the observation
  is its stdout, then stderr's last lines when it failed, and its verdict when not `ok`.
- `calculator`: one arithmetic expression over integers with + - * / and parentheses, evaluated exactly
  (`scalerl.tasks.expression`: no `eval`), answered as an integer or a fraction `p/q`.

A malformed call (no name, an unknown tool) is answered with an error line naming the tools: the model
sees what went wrong, as it would from a real tool, and the episode goes on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from scalerl.sandbox import Limits, Verdict, run_python
from scalerl.tasks.base import tool_call
from scalerl.tasks.expression import ExpressionError, evaluate_expression

TOOL_NAMES = ("python", "calculator")
TOOL_CLOSE = "</tool>"
RESULT_OPEN = "<result>\n"
RESULT_CLOSE = "\n</result>\n"
_CALL = re.compile(r'<tool\s+name\s*=\s*"([^"]*)"\s*>\n?(.*?)\s*</tool>\s*$', re.DOTALL)
_STDERR_LINES = 5  # the tail of a failed program's stderr shown to the model (the traceback's end)
TOOL_LIMITS = Limits(wall_s=5.0, cpu_s=5, memory_bytes=256 << 20, output_bytes=64 << 10)
"""A python call's default limits (`environment.tool_wall_s` and `tool_memory_mb` set the first and third)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    text: str


def parse_call(turn_text: str) -> ToolCall | None:
    """The call a turn ends with (the last `<tool name="...">...</tool>`), or None when it has none."""
    start = turn_text.rfind("<tool")
    if start < 0:
        return None
    m = _CALL.search(turn_text, start)
    return ToolCall(m.group(1).strip(), m.group(2)) if m else None


@dataclass(frozen=True, slots=True)
class Observation:
    """What one call gives back: the text the model sees and the execution's verdict (`ok`, `error`, a
    sandbox verdict such as `timeout` or `memory`, or `invalid` for a call to no tool)."""

    text: str
    verdict: str


class Tools(Protocol):
    """What an episode runner needs of its tools: this module's `Toolbox` (calls run in this process's
    sandbox) or `scalerl.environment.remote.RemoteToolbox` (calls run by the environment service)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def workers(self) -> int:
        """How many calls may run side by side."""
        ...

    def instructions(self) -> str: ...
    def execute(self, call: ToolCall | None) -> Observation: ...


def tool_limits(wall_s: float, memory_mb: int) -> Limits:
    """A python call's limits from `environment.tool_wall_s` and `tool_memory_mb`."""
    return Limits.from_spec(wall_s, memory_mb, output_bytes=TOOL_LIMITS.output_bytes)


def instructions(names: Sequence[str]) -> str:
    """What the prompt tells the model about the tools `names` (appended to each prompt)."""
    about = {"python": "python: runs a Python program and shows what it prints",
             "calculator": "calculator: evaluates one expression of integers with + - * / and parentheses"}
    lines = "\n".join(f"- {about[n]}" for n in names)
    return (f"\n\nWhile thinking you may call a tool:\n{lines}\n"
            f"Write {tool_call('NAME', 'INPUT')} and its answer follows as <result>...</result>.")


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in TOOL_NAMES]
    if unknown or not names:
        raise ValueError(f"tools: {unknown or 'none given'}; allowed: {', '.join(TOOL_NAMES)}")
    return tuple(names)


@dataclass(frozen=True)
class Toolbox:
    """The tools of a job and the limits of each python execution, run in this process's sandbox."""

    names: tuple[str, ...]
    limits: Limits = TOOL_LIMITS
    workers: int = 4

    def __post_init__(self) -> None:
        check_names(self.names)

    def instructions(self) -> str:
        return instructions(self.names)

    def execute(self, call: ToolCall | None, limits: Limits | None = None) -> Observation:
        """One call's observation (None: the turn ended on `</tool>` without a parsable call); `limits`
        replaces the toolbox's for a python call."""
        if call is None:
            return Observation(f'error: a call is <tool name="NAME">INPUT</tool>; tools: {", ".join(self.names)}',
                               "invalid")
        if call.name not in self.names:
            return Observation(f"error: unknown tool {call.name[:40]!r}; tools: {', '.join(self.names)}", "invalid")
        if call.name == "calculator":
            return _calculate(call.text)
        return _python(call.text, limits or self.limits)

    def run(self, call: ToolCall | None) -> str:
        """The observation's text for one call."""
        return self.execute(call).text

    def run_many(self, calls: Sequence[ToolCall | None]) -> list[str]:
        """Observations of `calls`, executed side by side (each python call is its own sandboxed process)."""
        return side_by_side(self.execute, calls, self.workers)


def side_by_side(execute: Callable[[ToolCall | None], Observation], calls: Sequence[ToolCall | None],
                 workers: int) -> list[str]:
    """The observations' texts of `calls`, at most `workers` of them executed at once."""
    if len(calls) <= 1:
        return [execute(c).text for c in calls]
    with ThreadPoolExecutor(max_workers=min(workers, len(calls)), thread_name_prefix="tool") as pool:
        return [o.text for o in pool.map(execute, calls)]


def _calculate(text: str) -> Observation:
    try:
        value = evaluate_expression(text.strip(), integer_steps=False).value
    except ExpressionError as exc:
        return Observation(f"error: {exc}", "error")
    return Observation(str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}",
                       "ok")


def _python(source: str, limits: Limits) -> Observation:
    ex = run_python(source, limits=limits)
    out = ex.stdout
    if ex.verdict is not Verdict.OK:  # the private dir's random name left out: the same failure reads the same
        stderr = ex.stderr.replace(ex.workdir.rstrip("/") + "/", "") if ex.workdir else ex.stderr
        tail = "\n".join(stderr.strip().splitlines()[-_STDERR_LINES:])
        out = "\n".join(part for part in (out.rstrip("\n"), tail, f"[{ex.verdict.value}]") if part)
    return Observation(out.rstrip("\n"), ex.verdict.value)
