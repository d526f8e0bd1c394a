"""The sandbox's worker: the process that runs the code. Forked by the launcher (launcher.py) or its
namespace's init, it puts itself in a process group of its own, takes no_new_privs, Landlock, an empty
capability set, the seccomp filter and the rlimits (each reported on the status pipe, which it then
closes), and runs the code: in Python mode in this same interpreter, as `python main.py` would, with the
verdicts a plain exit code cannot carry mapped to protocol.py's exit codes; in exec mode through execv.
Stdlib only, and no module that is slow to import (see launcher.py)."""

from __future__ import annotations

import _signal
import errno
import os
import resource
import sys

from scalerl.sandbox import landlock, linux, protocol, seccomp

TYPE_CHECKING = False  # as in launcher.py: no `typing` at run time
if TYPE_CHECKING:
    from typing import NoReturn

_SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
_SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
)


class Status:
    """Writes protocol.py's status lines on the status pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __call__(self, *fields: object) -> None:
        os.write(self.fd, protocol.status_line(*fields))

    def layer(self, name: str, active: bool, detail: str) -> None:
        self("layer", name, int(active), detail)


class Plan:
    """The execution's settings, from the launcher's `key=value` arguments (protocol.encode_args)."""

    def __init__(self, options: dict[str, str], argv: list[str]) -> None:
        self.mode = options["mode"]
        self.workdir = options["workdir"]
        self.entry = options.get("entry", "")
        self.argv = argv
        self.cpu_s = int(options["cpu"])
        self.memory = int(options["memory"])
        self.file_size = int(options["fsize"])
        self.processes = int(options["nproc"])
        self.open_files = int(options["nofile"])
        self.namespaces = options["namespaces"] == "1"
        self.nproc_limit = self.processes
        self.nproc_how = ""
        self.signal_barrier = ""  # set by the launcher when a pid namespace or a uid of its own keeps signals in


def run(plan: Plan, status: Status, parent: int) -> NoReturn:
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, _signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(protocol.EXIT_SETUP)
        os.setpgid(0, 0)
        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGTERM})  # held by the launcher
        os.chdir(plan.workdir)
        _restrict(plan, status)
        if plan.mode == "exec":
            os.set_inheritable(status.fd, False)  # open until execv: an exec failure is still reported
        else:
            os.close(status.fd)  # the user's code cannot write status lines
    except BaseException as exc:
        status("fail", f"worker: {exc!r}")
        os._exit(protocol.EXIT_SETUP)
    if plan.mode == "python":
        _finish(_run_source(plan.entry))
    _exec(plan.argv, status)


def _restrict(plan: Plan, status: Status) -> None:
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    status.layer("no_new_privs", True, "no setuid or file-capability gain, as Landlock and seccomp need")
    abi = landlock.abi_version()
    if abi:
        status.layer("landlock", True, landlock.restrict(_landlock_rules(plan.workdir), abi))
    else:
        status.layer(
            "landlock",
            False,
            "unavailable (not in the kernel, disabled, or refused by a seccomp profile): "
            "file permissions alone limit access",
        )
    linux.drop_capabilities()
    status.layer("capabilities", True, "none (effective, permitted, inheritable and ambient sets empty)")
    # what keeps the code from signalling the service (or anything of its uid): the first layer that does
    if plan.signal_barrier:
        barrier = plan.signal_barrier
    elif abi >= 6:
        barrier = "Landlock's signal scope"
    else:
        barrier = ""
    try:
        status.layer("seccomp", True, seccomp.load(signals_only_to=0 if barrier else os.getpid()))
        barrier = barrier or "seccomp: its own process group and threads only"
    except seccomp.Unavailable as exc:
        status.layer("seccomp", False, str(exc))
    status.layer("signals", bool(barrier), barrier or "nothing stops signals to processes of the service's uid")
    _set_limits(plan, status)


def _landlock_rules(workdir: str) -> list[tuple[str, int]]:
    prefixes = {sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix}
    rules = [(path, landlock.READ) for path in (*sorted(prefixes), *_SYSTEM_READ)]
    rules += [(path, landlock.READ_FILE) for path in _SYSTEM_FILES]
    rules.append(("/dev/null", landlock.READ_FILE | landlock.WRITE_FILE | landlock.TRUNCATE | landlock.IOCTL_DEV))
    rules.append(("/proc/self", landlock.READ_FILE | landlock.READ_DIR))
    rules.append((workdir, landlock.WRITE))
    return rules


def _set_limits(plan: Plan, status: Status) -> None:
    def lower(which: int, soft: int, hard: int) -> int:
        current = resource.getrlimit(which)[1]  # a hard limit can only come down
        if current != resource.RLIM_INFINITY:
            hard = min(hard, current)
        resource.setrlimit(which, (min(soft, hard), hard))
        return min(soft, hard)

    lower(resource.RLIMIT_CORE, 0, 0)
    cpu = lower(resource.RLIMIT_CPU, plan.cpu_s, plan.cpu_s + 1)  # SIGXCPU, then SIGKILL a second later
    memory = lower(resource.RLIMIT_AS, plan.memory, plan.memory)
    file_size = lower(resource.RLIMIT_FSIZE, plan.file_size, plan.file_size)
    nproc = lower(resource.RLIMIT_NPROC, plan.nproc_limit, plan.nproc_limit)
    nofile = lower(resource.RLIMIT_NOFILE, plan.open_files, plan.open_files)
    status.layer(
        "rlimits",
        True,
        f"CPU {cpu} s, address space {memory} B, file size {file_size} B, "
        f"{nproc} tasks ({plan.nproc_how}), {nofile} open files, no core dumps",
    )


def _run_source(path: str) -> int:
    """Run the file as `python path` would, in this (restricted) interpreter; its exit code."""
    for name in ("exit", "quit"):  # what `site` (off under -S) would have added
        setattr(sys.modules["builtins"], name, sys.exit)
    for name in [m for m in sys.modules if m.split(".")[0] == "scalerl"]:  # the sandbox's own, not the code's
        del sys.modules[name]
    main = type(sys)("__main__")
    main.__file__ = path
    sys.modules["__main__"] = main
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(path))
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
        exec(code, main.__dict__)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return (exc.code or 0) & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:  # our own frames
            tb = tb.tb_next
        try:  # noqa: SIM105
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # it prints exc.__traceback__
        except BaseException:
            pass
        return _exit_code_for(exc)
    return 0


def _exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, MemoryError):
        return protocol.EXIT_MEMORY
    if isinstance(exc, PermissionError):
        return protocol.EXIT_FORBIDDEN
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return protocol.EXIT_FILE_SIZE
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return protocol.EXIT_MEMORY
    return 1


def _finish(code: int) -> NoReturn:
    """Exit as the interpreter would (non-daemon threads joined, atexit, flushed streams), as
    multiprocessing's forked children do, without unwinding into the launcher's frames."""
    threading = sys.modules.get("threading")
    for step in (getattr(threading, "_shutdown", None), getattr(sys.modules.get("atexit"), "_run_exitfuncs", None)):
        try:
            if step is not None:
                step()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105
            stream.flush()
        except BaseException:
            pass
    os._exit(code)


def _exec(argv: list[str], status: Status) -> NoReturn:
    for signum in (_signal.SIGPIPE, _signal.SIGXFSZ):  # Python ignores them; a program expects the default
        _signal.signal(signum, _signal.SIG_DFL)
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        message = f"cannot execute {argv[0]}: {exc.strerror}"
        os.write(2, f"sandbox: {message}\n".encode())
        status("execfail", exc.errno or 0, message)
        os._exit(protocol.EXIT_EXEC)
