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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from scalerl.sandbox import Limits, Verdict, run_python
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


@dataclass(frozen=True)
class Toolbox:
    """The tools of a job and the limits of each python execution."""

    names: tuple[str, ...]
    limits: Limits = TOOL_LIMITS
    workers: int = 4

    def __post_init__(self) -> None:
        unknown = [n for n in self.names if n not in TOOL_NAMES]
        if unknown or not self.names:
            raise ValueError(f"tools: {unknown or 'none given'}; allowed: {', '.join(TOOL_NAMES)}")

    def instructions(self) -> str:
        """What the prompt tells the model about the tools (appended to each prompt)."""
        about = {"python": "python: runs a Python program and shows what it prints",
                 "calculator": "calculator: evaluates one expression of integers with + - * / and parentheses"}
        lines = "\n".join(f"- {about[n]}" for n in self.names)
        return (f"\n\nWhile thinking you may call a tool:\n{lines}\n"
                f'Write <tool name="NAME">\nINPUT\n</tool> and its answer follows as <result>...</result>.')

    def run(self, call: ToolCall | None) -> str:
        """The observation's text for one call (None: the turn ended on `</tool>` without a parsable call)."""
        if call is None:
            return f'error: a call is <tool name="NAME">INPUT</tool>; tools: {", ".join(self.names)}'
        if call.name not in self.names:
            return f"error: unknown tool {call.name[:40]!r}; tools: {', '.join(self.names)}"
        if call.name == "calculator":
            return _calculate(call.text)
        return _python(call.text, self.limits)

    def run_many(self, calls: Sequence[ToolCall | None]) -> list[str]:
        """Observations of `calls`, executed side by side (each python call is its own sandboxed process)."""
        if len(calls) <= 1:
            return [self.run(c) for c in calls]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(calls)), thread_name_prefix="tool") as pool:
            return list(pool.map(self.run, calls))


def _calculate(text: str) -> str:
    try:
        value = evaluate_expression(text.strip(), integer_steps=False).value
    except ExpressionError as exc:
        return f"error: {exc}"
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _python(source: str, limits: Limits) -> str:
    ex = run_python(source, limits=limits)
    out = ex.stdout
    if ex.verdict is not Verdict.OK:
        tail = "\n".join(ex.stderr.strip().splitlines()[-_STDERR_LINES:])
        out = "\n".join(part for part in (out.rstrip("\n"), tail, f"[{ex.verdict.value}]") if part)
    return out.rstrip("\n")
