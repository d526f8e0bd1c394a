"""Running code in the sandbox, from the service's side.

Each execution: a private temp dir (the code's files, its cwd, HOME and TMPDIR; deleted afterwards), stdin
from a read-only memfd, and the launcher (launcher.py) started as `python -I -S launcher.py ...` in a
session of its own with an environment of PATH, LANG, HOME and TMPDIR only. The launcher sets up the
layers and reports them, and the worker's end, on a status pipe (protocol.py). Here: stdout and stderr are
read with a selector (never a blocking read) up to Limits.output_bytes together; at the wall deadline or
the output cap the launcher is told to stop (SIGTERM: it kills everything and reports), and if it has not
finished a second later its process group is killed and every process still in its session (which no
sandboxed process can leave: seccomp denies setsid) is killed by a scan of /proc. Nothing outlives a call.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from scalerl.sandbox import landlock, linux, protocol
from scalerl.sandbox.model import Execution, Layer, Limits, SandboxError, Verdict
from scalerl.sandbox.verdict import Report, verdict_of

LAUNCHER = Path(__file__).with_name("launcher.py")
PATH = "/usr/local/bin:/usr/bin:/bin"
_GRACE_S = 1.0  # after a stop, how long the launcher has to kill everything and report
_DEFAULT = Limits()


def run_python(
    source: str, *, stdin: str | bytes = "", limits: Limits = _DEFAULT, files: Mapping[str, str | bytes] | None = None
) -> Execution:
    """Run `source` as `python main.py` would (the standard library only: no site-packages) in a fresh
    sandbox; `files` (relative path -> content) are written beside it first."""
    if files and "main.py" in files:
        raise ValueError("files: main.py is the source itself")
    return _execute("python", [], {"main.py": source, **(files or {})}, stdin, limits, entry="main.py")


def run(
    argv: Sequence[str],
    *,
    files: Mapping[str, str | bytes] | None = None,
    stdin: str | bytes = "",
    limits: Limits = _DEFAULT,
) -> Execution:
    """Execute a program in a fresh sandbox, its argv[0] looked up on PATH (/usr/local/bin:/usr/bin:/bin)
    unless it holds a '/'. Only the system's directories and the interpreter's prefix are readable and
    executable; the temp dir is writable but not executable."""
    if not argv:
        raise ValueError("argv is empty")
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=PATH)
    if program is None:
        raise FileNotFoundError(f"{argv[0]} is not on PATH={PATH}")
    return _execute("exec", [program, *argv[1:]], dict(files or {}), stdin, limits)


@lru_cache(maxsize=2)
def isolation(use_namespaces: bool = True) -> tuple[Layer, ...]:
    """The layers an execution gets on this host, found by running one (`pass`) and keeping what its
    launcher reported, so that nothing unavailable is claimed. Cached for the life of the process."""
    return run_python("pass", limits=Limits(wall_s=30, use_namespaces=use_namespaces)).layers


@lru_cache(maxsize=1)
def _guard_service() -> Layer:
    """Keep the service's /proc/<pid> (environ, mem, fds) from the code. Root: the code runs as another uid.
    Landlock: the code may read no /proc/<pid> but its own. Neither (a Pod on a kernel without Landlock):
    the service makes itself non-dumpable, once, which closes those files to other processes of its uid."""
    if os.geteuid() == 0:
        return Layer("service", True, "its /proc/<pid> closed to the code's uid (another uid)")
    if landlock.abi_version() > 0:
        return Layer("service", True, "its /proc/<pid> closed to the code by Landlock")
    linux.prctl(linux.PR_SET_DUMPABLE, 0)
    return Layer("service", True, "made itself non-dumpable (no Landlock here): its /proc/<pid> closed to its uid")


@lru_cache(maxsize=1)
def interpreter() -> tuple[str, str]:
    """The Python the sandbox runs (the service's own base interpreter) and a note. As root the code runs as
    another uid, which must be able to read it: if it cannot (e.g. a pyenv under /root), the system's."""
    own = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if os.geteuid() != 0 or (_others_can_reach(own) and _others_can_reach(os.path.dirname(os.__file__))):
        return own, "the service's own"
    for candidate in ("/usr/local/bin/python3", "/usr/bin/python3"):
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and _others_can_reach(real):
            return real, f"not the service's {own}: the sandbox's uid cannot read that one"
    raise SandboxError(
        f"no Python the sandbox's uid can read: {own} is not (and no /usr/local/bin/python3 or /usr/bin/python3 is)"
    )


def _others_can_reach(path: str) -> bool:
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        try:
            if not os.stat(os.path.join(*parts[:i])).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _execute(
    mode: str, argv: list[str], files: Mapping[str, str | bytes], stdin: str | bytes, limits: Limits, entry: str = ""
) -> Execution:
    python, note = interpreter()
    workdir = tempfile.mkdtemp(prefix="scalerl-sandbox-")
    try:
        _write_files(workdir, files)
        options = {
            "mode": mode,
            "workdir": workdir,
            "entry": os.path.join(workdir, entry) if entry else "",
            "cpu": str(limits.cpu_s),
            "memory": str(limits.memory_bytes),
            "fsize": str(limits.file_size_bytes),
            "nproc": str(limits.max_processes),
            "nofile": str(limits.open_files),
            "namespaces": "1" if limits.use_namespaces else "0",
        }
        base = (
            Layer(
                "process",
                True,
                "a process per execution in a session of its own; every descendant killed before the call returns",
            ),
            Layer("environment", True, "PATH, LANG, HOME and TMPDIR only"),
            Layer("workdir", True, "a private temp dir, the only writable place; deleted afterwards"),
            Layer("interpreter", True, f"{python} ({note})"),
            _guard_service(),
        )
        return _launch(python, mode, options, argv, stdin, limits, workdir, base)
    finally:
        _remove(workdir)


def _write_files(workdir: str, files: Mapping[str, str | bytes]) -> None:
    for name, content in files.items():
        rel = os.path.normpath(name)
        if os.path.isabs(rel) or rel == "." or rel.split(os.sep)[0] == "..":
            raise ValueError(f"files: {name!r} is not a relative path inside the temp dir")
        path = os.path.join(workdir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)


def _stdin_fd(data: str | bytes) -> int:
    """A read-only fd on a memfd holding `data`: never blocks the service, cannot be written by the code."""
    raw = memoryview(data.encode() if isinstance(data, str) else data)
    fd = os.memfd_create("scalerl-sandbox-stdin", os.MFD_CLOEXEC)
    try:
        while raw:
            raw = raw[os.write(fd, raw) :]
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(fd)


def _launch(
    python: str,
    mode: str,
    options: dict[str, str],
    argv: list[str],
    stdin: str | bytes,
    limits: Limits,
    workdir: str,
    base: tuple[Layer, ...],
) -> Execution:
    stdin_fd = _stdin_fd(stdin)
    try:
        status_r, status_w = os.pipe()
    except OSError:
        os.close(stdin_fd)
        raise
    options["status_fd"] = str(status_w)
    env = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [python, "-I", "-S", str(LAUNCHER), *protocol.encode_args(options, argv)],
            stdin=stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
    except OSError as exc:
        os.close(status_r)
        raise SandboxError(f"cannot start the launcher with {python}: {exc}") from exc
    finally:
        os.close(status_w)
        os.close(stdin_fd)
    capture = _Capture(proc, status_r, limits, start)
    try:
        capture.run()
    finally:
        usage = capture.finish()
    wall = time.monotonic() - start
    report = Report(capture.status.decode("utf-8", "replace"))
    if report.fail is not None:
        raise SandboxError(f"the sandbox could not be set up: {report.fail}")
    if report.wait_status is None and capture.stopped_for is None:
        raise SandboxError(
            f"the launcher ended without a report (exit {proc.returncode}): "
            f"{capture.err[-2000:].decode('utf-8', 'replace')}"
        )
    verdict, code, signum = verdict_of(mode, limits, capture.stopped_for, report)
    cpu = report.cpu if report.cpu is not None else usage.ru_utime + usage.ru_stime
    return Execution(
        verdict=verdict,
        exit_code=code,
        signal=signum,
        stdout=capture.out.decode("utf-8", "replace"),
        stderr=capture.err.decode("utf-8", "replace"),
        wall_s=wall,
        cpu_s=cpu,
        truncated=capture.truncated,
        layers=base + tuple(report.layers),
        workdir=workdir,
    )


class _Capture:
    """Reads the launcher's stdout, stderr and status pipe until they close, within the deadlines."""

    def __init__(self, proc: subprocess.Popen[bytes], status_r: int, limits: Limits, start: float) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.limits = limits
        self.out, self.err, self.status = bytearray(), bytearray(), bytearray()
        self.fds = {proc.stdout.fileno(): self.out, proc.stderr.fileno(): self.err, status_r: self.status}
        self.status_fd = status_r
        self.deadline = start + limits.wall_s
        self.stopped_for: Verdict | None = None
        self.truncated = False
        self.forced = False

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for fd in self.fds:
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                now = time.monotonic()
                if now >= self.deadline:
                    if self.stopped_for is not None or not self._launcher_running():
                        self._drain(selector)  # a launcher that ended at the deadline left its report unread
                        self.forced = True  # the launcher did not finish, or something outlived it
                        return
                    self._stop(Verdict.TIMEOUT)
                    continue
                for key, _ in selector.select(self.deadline - now):
                    self._read(selector, key.fd)

    def _read(self, selector: selectors.BaseSelector, fd: int) -> bool:
        """One read of `fd` into its buffer; False when it has nothing now or has closed."""
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            selector.unregister(fd)
            if fd == self.status_fd:  # the launcher is done: the output must close now too
                self.deadline = min(self.deadline, time.monotonic() + _GRACE_S)
            return False
        self._take(fd, data)
        return True

    def _drain(self, selector: selectors.BaseSelector) -> None:
        """Take what the pipes hold now, without waiting for more."""
        for key in list(selector.get_map().values()):
            while self._read(selector, key.fd):
                pass

    def _launcher_running(self) -> bool:
        # WNOWAIT: the launcher stays unreaped, so its pid (the session's id) cannot be reused before `finish`
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None

    def _take(self, fd: int, data: bytes) -> None:
        buffer = self.fds[fd]
        if buffer is self.status:
            buffer += data
            return
        if self.stopped_for is not None:
            return  # drained and dropped: the writers must not block while they are being killed
        room = self.limits.output_bytes - len(self.out) - len(self.err)
        buffer += data[:room]
        if len(data) > room:
            self.truncated = True
            self._stop(Verdict.OUTPUT_LIMIT)

    def _stop(self, why: Verdict) -> None:
        self.stopped_for = why
        self.deadline = time.monotonic() + _GRACE_S
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)

    def finish(self) -> resource.struct_rusage:
        """Kill what is left (if anything is), reap the launcher, close the pipes; its rusage."""
        pid = self.proc.pid
        if self.forced or self.stopped_for is not None or b"\ncpu " not in b"\n" + self.status:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _kill_session(pid)  # before reaping the launcher: its pid (the session's id) stays reserved
        _, wait_status, usage = os.wait4(pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(wait_status)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()  # by its file object, which would otherwise close the fd number again later
        os.close(self.status_fd)
        return usage


def _kill_session(sid: int) -> None:
    """SIGKILL every live process of session `sid` until none is left (zombies are their parents' to reap)."""
    for _ in range(200):
        alive = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
                alive.append(int(name))
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    raise SandboxError(f"processes of session {sid} survived SIGKILL for 2 s")


def _remove(path: str) -> None:
    """Delete the temp dir, whatever modes the code left on it (directories chmod-ed to 0 included)."""
    try:
        shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    os.chmod(path, 0o700)
    for root, dirs, _ in os.walk(path):  # top-down: each directory is made readable before it is listed
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o700, follow_symlinks=False)
    shutil.rmtree(path, ignore_errors=True)
