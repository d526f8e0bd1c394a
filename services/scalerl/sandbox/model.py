"""The sandbox's values: the limits of one execution, its verdict and what it produced, the layers it ran
under."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class SandboxError(RuntimeError):
    """The sandbox itself could not run (set-up failed, the launcher vanished): nothing is known of the code."""


@dataclass(frozen=True)
class Limits:
    """What one execution may use. Every limit is applied; none can be raised from inside.

    `max_processes` counts processes and threads together (the kernel's RLIMIT_NPROC), the code's own
    main process included. `output_bytes` caps stdout and stderr together: beyond it the execution is
    stopped (verdict `output_limit`). `use_namespaces=False` skips the user/pid/network/mount namespaces
    even where the host allows them (as inside most Pods), so that path can be run and tested anywhere.
    """

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 512 << 20  # address space (RLIMIT_AS)
    file_size_bytes: int = 16 << 20  # any one file written (RLIMIT_FSIZE)
    max_processes: int = 32
    output_bytes: int = 1 << 20
    open_files: int = 64
    use_namespaces: bool = True

    def __post_init__(self) -> None:
        if not self.wall_s > 0:
            raise ValueError(f"wall_s must be > 0, got {self.wall_s}")
        for name in ("cpu_s", "memory_bytes", "file_size_bytes", "max_processes", "output_bytes", "open_files"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.open_files < 8:  # stdin, stdout, stderr and what the interpreter opens itself
            raise ValueError(f"open_files must be >= 8, got {self.open_files}")

    @classmethod
    def from_spec(cls, wall_s: float, memory_mb: int, **others: Any) -> Limits:
        """Limits from a job spec's wall-clock seconds and MiB: the CPU limit is the wall limit in whole
        seconds (at least 1); `others` set the remaining fields."""
        return cls(wall_s=wall_s, cpu_s=max(1, int(wall_s)), memory_bytes=memory_mb << 20, **others)


class Verdict(StrEnum):
    OK = "ok"  # exit code 0
    ERROR = "error"  # another exit code, or an uncaught exception
    TIMEOUT = "timeout"  # the wall-clock deadline or the CPU limit
    MEMORY = "memory"  # MemoryError / ENOMEM at the top level, or a segfault at the address-space limit
    OUTPUT_LIMIT = "output_limit"  # stdout + stderr beyond Limits.output_bytes
    FORBIDDEN = "forbidden"  # a denied system call, write, read or connection (PermissionError, SIGSYS)
    FILE_SIZE = "file_size"  # a file beyond Limits.file_size_bytes (EFBIG, SIGXFSZ)
    KILLED = "killed"  # ended by another signal


@dataclass(frozen=True)
class Layer:
    """One isolation layer as an execution found it: set up (`active`) or not, and what it did or why not."""

    name: str
    active: bool
    detail: str


@dataclass(frozen=True)
class Execution:
    verdict: Verdict
    exit_code: int | None  # None when ended by a signal or stopped
    signal: int | None  # the signal that ended the code's main process, if one did
    stdout: str  # the captured bytes (at most Limits.output_bytes with stderr), decoded with "replace"
    stderr: str
    wall_s: float
    cpu_s: float  # user + system CPU of every process of the execution
    truncated: bool  # output went past Limits.output_bytes and was cut
    layers: tuple[Layer, ...]  # what this execution ran under
    workdir: str  # its private temp dir (already deleted), a unique id for logs

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK
