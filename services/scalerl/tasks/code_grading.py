"""Grading model-written code: the program, its tests, one sandboxed execution, a verdict.

A code problem's reference (`CodeReference`, carried as JSON in `Problem.answer`) holds the code the
completion continues (`prelude`: for HumanEval the signature and docstring), the tests (Python that
defines `check(candidate)`, HumanEval's convention) and the entry point. Grading a completion:

1. **The code** (`extract_code`): after the last `</think>` (all of the text without one), the last
   fenced ```python block (or bare ``` block), else the whole text. The program is `prelude + "\\n" + code`:
   a completion that continues the function body (indented lines) completes the prelude's function; one
   that writes the whole function redefines it (a function holding only its docstring is valid Python).
2. **The tests** are instrumented before they run (`instrument_tests`, on the reference, never on model
   code): every `assert` becomes a counted check, so a failing assert is recorded and the next one still
   runs, and the fraction of asserts that passed is known (`tests_passed`), not just the first failure.
3. **One execution** in the sandbox (`scalerl.sandbox.run_python`, the task's limits): the harness reads
   a per-execution nonce from stdin (consumed before any model code runs; held in a function's locals,
   not in a module), executes the program, then the tests (the names they count with are set after the
   program ran, so the model's code cannot replace them), and prints one summary line marked with the
   nonce. Correct only when the execution ended `ok`, the summary line is there with the nonce, and no
   assert failed: a completion that exits early with status 0 (`os._exit(0)` before the tests) has no
   summary and is wrong.

Verdicts (`CodeGrade.verdict`): `pass`, `fail` (an assert failed or the candidate raised inside one;
a MemoryError, PermissionError or file-too-large error inside one is not a wrong answer but the sandbox's),
`error` (the program or the tests raised outside an assert: a syntax error, a missing function),
`no_code`, and the sandbox's `timeout`, `memory`, `forbidden`, `output_limit`, `file_size`, `killed`.

What is not covered: the tests run in the same process as the model's code, so code written to walk the
interpreter's frames to the harness (or patch builtins the tests use) could forge a summary. Stronger
separation (the tests in a second process, talking to the candidate over a pipe) costs a second interpreter
per completion; docs/guides/code-tasks.md.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass

from scalerl.model.tokenizer import THINK_CLOSE
from scalerl.sandbox import Limits, Verdict, run_python

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_NONCE_BYTES = 16


@dataclass(frozen=True)
class CodeReference:
    """What grading a completion needs (serialised into `Problem.answer`)."""

    prelude: str
    tests: str
    entry_point: str

    def to_answer(self) -> str:
        return json.dumps({"prelude": self.prelude, "tests": self.tests, "entry_point": self.entry_point},
                          sort_keys=True)

    @classmethod
    def from_answer(cls, answer: str) -> CodeReference:
        """The reference in a code problem's `answer`; ValueError naming what is wrong."""
        try:
            obj = json.loads(answer)
        except json.JSONDecodeError as exc:
            raise ValueError(f"a code problem's answer is JSON with prelude, tests and entry_point ({exc.msg})") \
                from None
        keys = ("prelude", "tests", "entry_point")
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in keys):
            raise ValueError("a code problem's answer is JSON with prelude, tests and entry_point (strings)")
        return cls(obj["prelude"], obj["tests"], obj["entry_point"])


@dataclass(frozen=True)
class CodeGrade:
    """The outcome of one completion's tests."""

    verdict: str
    tests_passed: float  # asserts that passed / asserts in the tests (0 when the tests did not finish)
    seconds: float  # the execution's wall time (0 when nothing ran)
    detail: str = ""  # the first line of what went wrong, for a person reading `scalerl score`

    @property
    def correct(self) -> bool:
        return self.verdict == "pass"


def extract_code(completion: str) -> str | None:
    """The code of a completion (module docstring, step 1), or None when there is none."""
    region = completion.rpartition(THINK_CLOSE)[2] if THINK_CLOSE in completion else completion
    blocks = _FENCE.findall(region)
    code = blocks[-1] if blocks else region
    if not blocks and "```" in code:  # an unclosed fence: what follows the last opening
        code = code.rpartition("```")[2].partition("\n")[2]
    return code if code.strip() else None


class _CountAsserts(ast.NodeTransformer):
    """Each `assert` -> try: assert ... / except Exception as e: record(id, False, e) / else: record(id, True).
    (`record` raises again what the sandbox names: MemoryError, PermissionError, a file too large.)"""

    def __init__(self) -> None:
        self.count = 0

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        i = self.count
        self.count += 1

        def record(ok: bool) -> ast.stmt:
            args: list[ast.expr] = [ast.Constant(i), ast.Constant(ok)]
            if not ok:
                args.append(ast.Name("__scalerl_e__", ast.Load()))
            return ast.Expr(ast.Call(func=ast.Name("__scalerl_record__", ast.Load()), args=args, keywords=[]))

        handler = ast.ExceptHandler(type=ast.Name("__scalerl_Exception__", ast.Load()), name="__scalerl_e__",
                                    body=[record(False)])
        return ast.Try(body=[node], handlers=[handler], orelse=[record(True)], finalbody=[])


def instrument_tests(tests: str) -> tuple[str, int]:
    """The tests with every assert counted (module docstring, step 2) and how many asserts there are.
    Raises SyntaxError for tests that do not parse (a dataset error, reported when the task loads)."""
    tree = ast.parse(tests)
    counter = _CountAsserts()
    tree = ast.fix_missing_locations(counter.visit(tree))
    return ast.unparse(tree), counter.count


# The program the sandbox runs as main.py: standard library only (the sandbox has no site-packages).
_HARNESS = '''\
import json, sys


def main():
    nonce = sys.stdin.readline().strip()
    files = json.loads(sys.stdin.read())
    passed, failed = set(), set()

    def record(i, ok, exc=None):
        if isinstance(exc, MemoryError) or isinstance(exc, PermissionError) or getattr(exc, "errno", 0) == 27:
            raise exc  # a limit or a denial, not a wrong answer: the sandbox gives its verdict (27: EFBIG)
        (passed if ok else failed).add(i)

    ns = {"__name__": "__main__"}
    stage = "program"
    try:
        exec(compile(files["program"], "solution.py", "exec"), ns)
        stage = "tests"
        # set after the model's code ran: what it left under these names is replaced
        ns.update(__scalerl_record__=record, __scalerl_Exception__=Exception)
        exec(compile(files["tests"], "tests.py", "exec"), ns)
        ns["check"](ns[files["entry_point"]])
    except BaseException as e:
        print(nonce, "RAISED", stage, json.dumps(type(e).__name__ + ": " + str(e)[:300]), flush=True)
        raise  # the sandbox names it: MemoryError -> memory, PermissionError -> forbidden, ...
    print(nonce, "DONE", json.dumps(sorted(passed), separators=(",", ":")),
          json.dumps(sorted(failed), separators=(",", ":")), flush=True)


main()
'''


def harness_input(ref: CodeReference, code: str) -> tuple[str, str, int]:
    """(nonce, the harness's stdin, asserts in the tests) for one completion's `code`."""
    tests, n_asserts = instrument_tests(ref.tests)
    nonce = secrets.token_hex(_NONCE_BYTES)
    files = {"program": f"{ref.prelude}\n{code}\n", "tests": tests, "entry_point": ref.entry_point}
    return nonce, nonce + "\n" + json.dumps(files), n_asserts


def read_summary(stdout: str, nonce: str, n_asserts: int) -> tuple[str, float, str]:
    """(verdict, tests_passed, detail) from the harness's marked line in `stdout`; ("error", 0, ...) when
    there is none (the process ended before the harness could say anything)."""
    for line in reversed(stdout.splitlines()):
        head, _, rest = line.partition(" ")
        if head != nonce:
            continue
        kind, _, payload = rest.partition(" ")
        if kind == "DONE":
            passed_s, _, failed_s = payload.partition(" ")
            try:
                passed, failed = set(json.loads(passed_s)), set(json.loads(failed_s))
            except json.JSONDecodeError:  # cut by the output limit
                return "error", 0.0, "the summary of its tests was cut"
            fraction = len(passed - failed) / n_asserts if n_asserts else float(not failed)
            if failed:
                return "fail", fraction, f"{len(failed)} of {n_asserts} asserts failed"
            return "pass", fraction, ""
        if kind == "RAISED":
            stage, _, what = payload.partition(" ")
            return "error", 0.0, f"the {stage} raised {what}"
    return "error", 0.0, "the program ended before its tests finished"


_STOPPED = {
    Verdict.TIMEOUT: "stopped at its time limit ({limits.wall_s:g} s wall, {limits.cpu_s} s CPU)",
    Verdict.MEMORY: "stopped at its memory limit ({limits.memory_bytes} bytes of address space)",
    Verdict.OUTPUT_LIMIT: "stopped at its output limit ({limits.output_bytes} bytes)",
    Verdict.FILE_SIZE: "stopped at its file size limit ({limits.file_size_bytes} bytes)",
    Verdict.FORBIDDEN: "a forbidden system call, file or connection",
    Verdict.KILLED: "ended by a signal",
}


def grade_code(ref: CodeReference, completion: str, limits: Limits) -> CodeGrade:
    """Run `completion`'s code against `ref`'s tests in one sandboxed execution (module docstring)."""
    code = extract_code(completion)
    if code is None:
        return CodeGrade("no_code", 0.0, 0.0, "no code in the completion")
    nonce, stdin, n_asserts = harness_input(ref, code)
    ex = run_python(_HARNESS, stdin=stdin, limits=limits)
    verdict, fraction, detail = read_summary(ex.stdout, nonce, n_asserts)
    if ex.verdict not in (Verdict.OK, Verdict.ERROR):  # the sandbox stopped it or named what it raised
        if "raised" not in detail:
            detail = _STOPPED.get(ex.verdict, ex.verdict.value).format(limits=limits)
        return CodeGrade(ex.verdict.value, fraction if verdict == "fail" else 0.0, ex.wall_s, detail)
    if ex.verdict is Verdict.ERROR and verdict == "pass":  # it said done, then did not exit cleanly
        return CodeGrade("error", fraction, ex.wall_s, f"exit code {ex.exit_code} after its tests")
    return CodeGrade(verdict, fraction, ex.wall_s, detail)
