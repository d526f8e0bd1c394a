"""A time limit on a scorer whose running time nothing else bounds: grading in a child process.

Which tasks need it (`Task.grading_is_bounded`): the built-in arithmetic and Countdown checks are linear
in the completion's length, and code runs in the sandbox under its own wall limit, so they grade in the
verifier's process. A JSONL (math) task runs math_verify and sympy on model text, and a plugin's
`grade` is anyone's code: those grade here, in one long-lived child process per verifier, with a
deadline per completion (`task.grade_time_limit_s`). A completion that takes longer gets the verdict
`timeout` (reward incorrect); the child is killed at once (it may be stuck in C code a thread could
never leave) and a new one is started for the next completion. The role never waits past the limit.

The child is started with `spawn` (never `fork`: the verifier has threads) and builds the task from the
spec's `task` section itself, so nothing but strings crosses the pipe. Its start (imports, the task's
problems) is not counted against a completion's limit; a child that does not start within
`START_S` fails the grade with an error naming why.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from scalerl.tasks.base import Grade

START_S = 120.0
"""How long a new child may take to import and build its task (seconds; a loaded 2-core machine)."""


def _serve(conn: Connection, task_config: dict[str, Any]) -> None:
    """The child: build the task, then grade (completion, answer) pairs until the pipe closes."""
    from scalerl.config import TaskConfig
    from scalerl.tasks.registry import task_from_config

    try:
        task = task_from_config(TaskConfig.model_validate(task_config))
    except Exception as exc:  # the parent checked the spec: this is the environment's fault
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", ""))
    while True:
        try:
            completion, answer = conn.recv()
        except EOFError:
            return
        t0 = time.perf_counter()
        try:
            g = task.grade(completion, answer)
        except Exception as exc:  # a scorer that raises on model output: wrong, with why
            g = Grade(False, "error", detail=f"the scorer raised {type(exc).__name__}: {str(exc)[:200]}")
        conn.send(("grade", (g.correct, g.verdict, g.seconds or time.perf_counter() - t0, g.metrics, g.detail)))


class GuardedGrader:
    """`grade(completion, answer)` in a child process, at most `time_limit_s` per completion (module doc).
    One completion at a time (a lock); `close()` ends the child. Counters: `timeouts`, `starts` (children started)."""

    def __init__(self, task_config: dict[str, Any], time_limit_s: float) -> None:
        if not time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
        self.task_config = task_config
        self.time_limit_s = time_limit_s
        self.timeouts = 0
        self.starts = 0
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Connection | None = None

    def _start(self) -> Connection:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, self.task_config), name="scalerl-grader", daemon=True)
        proc.start()
        child.close()
        if not parent.poll(START_S):
            proc.kill()
            raise RuntimeError(f"the grading process did not start within {START_S:.0f} s")
        kind, what = parent.recv()
        if kind != "ready":
            proc.join(5)
            raise RuntimeError(f"the grading process could not build the task: {what}")
        self._proc, self._conn = proc, parent
        self.starts += 1
        return parent

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def grade(self, completion: str, answer: str) -> Grade:
        with self._lock:
            conn = self._conn
            if conn is None:
                conn = self._start()
            t0 = time.perf_counter()
            try:
                conn.send((completion, answer))
                done = conn.poll(self.time_limit_s)
                reply = conn.recv() if done else None
            except (EOFError, OSError) as exc:  # the child died (a crash in C code, an OOM kill)
                self._kill()
                return Grade(False, "error", time.perf_counter() - t0, detail=f"the grading process died ({exc})")
            if reply is None:
                self.timeouts += 1
                self._kill()
                return Grade(False, "timeout", time.perf_counter() - t0,
                             detail=f"graded for more than {self.time_limit_s:g} s (task.grade_time_limit_s)")
            correct, verdict, seconds, metrics, detail = reply[1]
            return Grade(correct, verdict, seconds, metrics, detail)

    def close(self) -> None:
        with self._lock:
            self._kill()
