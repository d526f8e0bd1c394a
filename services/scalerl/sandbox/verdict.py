"""From what the launcher reported (its status lines, protocol.py) to an execution's verdict."""

from __future__ import annotations

import os
import signal

from scalerl.sandbox import protocol
from scalerl.sandbox.model import Layer, Limits, Verdict


class Report:
    """The launcher's status lines (protocol.py), written before any of the user's code ran."""

    def __init__(self, text: str) -> None:
        self.layers: list[Layer] = []
        self.wait_status: int | None = None
        self.maxrss_kib = 0
        self.cpu: float | None = None
        self.fail: str | None = None
        self.exec_errno: int | None = None
        for line in text.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "layer":
                name, active, detail = rest.split(" ", 2)
                self.layers.append(Layer(name, active == "1", detail))
            elif kind == "exit":
                wait_status, maxrss = rest.split()
                self.wait_status, self.maxrss_kib = int(wait_status), int(maxrss)
            elif kind == "cpu":
                self.cpu = float(rest)
            elif kind == "fail":
                self.fail = rest
            elif kind == "execfail":
                self.exec_errno = int(rest.split(" ", 1)[0])


def verdict_of(
    mode: str, limits: Limits, stopped_for: Verdict | None, report: Report
) -> tuple[Verdict, int | None, int | None]:
    code = signum = None
    if report.wait_status is not None:
        status = os.waitstatus_to_exitcode(report.wait_status)
        code, signum = (status, None) if status >= 0 else (None, -status)
    if stopped_for is not None:
        return stopped_for, code, signum
    if signum is not None:
        cpu = report.cpu or 0.0
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu >= limits.cpu_s):
            return Verdict.TIMEOUT, code, signum
        if signum == signal.SIGXFSZ:
            return Verdict.FILE_SIZE, code, signum
        if signum == signal.SIGSYS:
            return Verdict.FORBIDDEN, code, signum
        if signum in (signal.SIGSEGV, signal.SIGBUS) and report.maxrss_kib * 1024 >= limits.memory_bytes // 2:
            return Verdict.MEMORY, code, signum  # a stack or mmap growth refused at the address-space limit
        return Verdict.KILLED, code, signum
    if code == 0:
        return Verdict.OK, code, signum
    if report.exec_errno is not None:
        forbidden = report.exec_errno in (1, 13)  # EPERM, EACCES
        return (Verdict.FORBIDDEN if forbidden else Verdict.ERROR), code, signum
    if mode == "python":
        by_code = {
            protocol.EXIT_MEMORY: Verdict.MEMORY,
            protocol.EXIT_FORBIDDEN: Verdict.FORBIDDEN,
            protocol.EXIT_FILE_SIZE: Verdict.FILE_SIZE,
        }
        return by_code.get(code or 0, Verdict.ERROR), code, signum
    return Verdict.ERROR, code, signum
