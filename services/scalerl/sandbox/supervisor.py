"""The sandbox's launcher process (`python -I -S launcher.py KEY=VALUE... -- ARGV...`), started by
scalerl.sandbox.runner in a session of its own, with an environment of PATH, LANG, HOME and TMPDIR only, its
status pipe on fd `status_fd` (protocol.py) and its working directory the execution's private temp dir.

The process tree, with user namespaces (the kernel kills the whole namespace when its init exits):

    launcher (service's session)   root: switches to a uid of its own; unshare(user, pid, net, mount, ...)
      └─ init (pid 1)              mounts a /proc of the namespace; reaps; reports the worker's status
           └─ worker (pid 2)       own process group; no_new_privs, Landlock, no caps, seccomp, rlimits;
                                   runs the code (Python mode: in this interpreter; exec mode: execv)

Without them the launcher is the worker's parent and a child subreaper: after the worker ends it kills the
worker's process group (which nothing can leave: setsid/setpgid are denied by seccomp) and every orphan
re-parented to it, and reaps them all. SIGTERM from the service (wall time or output limit) does the same
at once. Stdlib only, and no module that is slow to import.
"""

from __future__ import annotations

import _signal  # the `signal` module imports enum: milliseconds at every execution
import os
import resource

from scalerl.sandbox import linux, protocol
from scalerl.sandbox.worker import Plan, Status
from scalerl.sandbox.worker import run as run_worker

# `typing` and `contextlib` cost milliseconds at every execution (hence try/except/pass, not suppress);
# mypy reads the name TYPE_CHECKING as True
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

_NAMESPACES = (
    linux.CLONE_NEWUSER
    | linux.CLONE_NEWNS
    | linux.CLONE_NEWPID
    | linux.CLONE_NEWNET
    | linux.CLONE_NEWIPC
    | linux.CLONE_NEWUTS
)


class _Stopped(BaseException):
    """The service sent SIGTERM (wall time, output limit): kill everything, report, exit."""


def _on_sigterm(signum: int, frame: object) -> None:
    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)  # once: the clean-up that follows must not be cut short
    raise _Stopped


def main(args: list[str]) -> int:
    options, argv = protocol.decode_args(args)
    status = Status(int(options["status_fd"]))
    plan = Plan(options, argv)
    _signal.signal(_signal.SIGTERM, _on_sigterm)
    # held until a supervisor's `try` (`_unblock_stop`): a stop never lands between a fork and its clean-up
    _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGTERM})
    try:
        switched = _switch_uid(plan.workdir, status)
        namespaces = plan.namespaces and _enter_namespaces(status)
        if not plan.namespaces:
            status.layer("namespaces", False, "off (use_namespaces=False)")
        linux.prctl(linux.PR_SET_DUMPABLE, 0)  # no /proc/<pid>/fd, environ or ptrace of the launcher and init
        _count_processes(plan, namespaces, switched)
        plan.signal_barrier = "a pid namespace of its own" if namespaces else "a uid of its own" if switched else ""
    except Exception as exc:
        status("fail", f"launcher: {exc!r}")
        return 1
    return _run_with_init(plan, status) if namespaces else _run_direct(plan, status)


def _unblock_stop() -> None:
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGTERM})


def _switch_uid(workdir: str, status: Status) -> bool:
    """As root: chown the temp dir to a uid of this execution's own and become it, with no groups."""
    if os.geteuid() != 0:
        status.layer("uid", False, f"the service's uid {os.getuid()} (not root: no other uid to switch to)")
        return False
    uid = protocol.SANDBOX_UID_BASE + os.getpid()
    for root, dirs, files in os.walk(workdir):
        os.lchown(root, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    linux.prctl(linux.PR_SET_DUMPABLE, 1)  # the uid change cleared it; writing our uid_map needs it
    status.layer("uid", True, f"uid and gid {uid} of this execution's own, no supplementary groups")
    return True


def _enter_namespaces(status: Status) -> bool:
    uid, gid = os.geteuid(), os.getegid()
    try:
        linux.unshare(_NAMESPACES)
    except OSError as exc:
        status.layer("namespaces", False, f"unshare: {exc.strerror} (no user namespaces here)")
        return False
    linux.write_file("/proc/self/setgroups", "deny")
    linux.write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    linux.write_file("/proc/self/gid_map", f"{gid} {gid} 1")
    status.layer("namespaces", True, "user, pid, network (no interface up), mount, ipc, uts")
    return True


def _count_processes(plan: Plan, namespaces: bool, switched: bool) -> None:
    """RLIMIT_NPROC counts the tasks (threads too) of a real uid, within a user namespace when there is one."""
    if namespaces:
        plan.nproc_limit = plan.processes + 2
        plan.nproc_how = "counted in the execution's user namespace"
    elif switched:
        plan.nproc_limit = plan.processes + 1
        plan.nproc_how = "counted for the execution's own uid"
    else:
        running = _tasks_of_uid(os.getuid())
        plan.nproc_limit = running + plan.processes
        plan.nproc_how = f"shared with the service's uid, which had {running} tasks"


def _tasks_of_uid(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


def _run_with_init(plan: Plan, status: Status) -> int:
    init = _fork(lambda: _init(plan, status))
    try:
        _unblock_stop()
        os.waitpid(init, 0)
    except _Stopped:
        _kill(init, _signal.SIGTERM)  # init kills and reaps the namespace: their CPU time is counted
        _wait(init)
        status("stopped")
    status("cpu", _children_cpu())
    return 0


def _init(plan: Plan, status: Status) -> NoReturn:
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, _signal.SIGKILL)
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
        _mount_proc(status)
        worker = _fork(lambda: run_worker(plan, status, parent=1))
        try:
            _unblock_stop()
            status("exit", *_reap_until(worker))
        except _Stopped:
            pass
        _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)  # a stop that comes now changes nothing
        _kill(-1, _signal.SIGKILL)  # from a namespace's init: every other process of the namespace
        while True:  # reaped here, not by the kernel once init is gone, so that their CPU time counts
            os.wait4(-1, 0)
    except ChildProcessError:
        pass
    except BaseException as exc:
        status("fail", f"init: {exc!r}")
    os._exit(0)


def _mount_proc(status: Status) -> None:
    flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    try:
        linux.mount("proc", "/proc", "proc", flags)
        status.layer("proc", True, "a /proc of the execution's own pid namespace")
    except OSError as exc:
        try:
            linux.mount("tmpfs", "/proc", "tmpfs", flags | linux.MS_RDONLY, "size=4k,mode=555")
            status.layer("proc", True, f"an empty /proc (a private proc mount failed: {exc.strerror})")
        except OSError as exc2:
            status.layer("proc", False, f"the host's /proc (mount: {exc2.strerror})")


def _run_direct(plan: Plan, status: Status) -> int:
    linux.prctl(linux.PR_SET_CHILD_SUBREAPER, 1)  # orphans of the worker's tree come back to us
    me = os.getpid()
    worker = _fork(lambda: run_worker(plan, status, parent=me))
    try:  # noqa: SIM105
        os.setpgid(worker, worker)  # the worker does it too: whichever runs first
    except OSError:
        pass
    try:
        try:
            _unblock_stop()
            status("exit", *_reap_until(worker))
        finally:
            _sweep(worker)
    except _Stopped:
        _sweep(worker)
        status("stopped")
    status("cpu", _children_cpu())
    return 0


def _fork(child: Callable[[], NoReturn]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(protocol.EXIT_SETUP)
    return pid


def _reap_until(pid: int) -> tuple[int, int]:
    """Reap children (orphans too) until `pid` is reaped: its wait status and peak RSS (KiB)."""
    while True:
        reaped, wait_status, usage = os.wait4(-1, 0)
        if reaped == pid:
            return wait_status, usage.ru_maxrss


def _sweep(pgid: int) -> None:
    """Kill the worker's process group and every child left to us (a subreaper), until none is left."""
    while True:
        _kill(-pgid, _signal.SIGKILL)
        for pid in _children():
            _kill(pid, _signal.SIGKILL)
        try:
            os.wait4(-1, 0)
        except ChildProcessError:
            return


def _children() -> list[int]:
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:  # no CONFIG_PROC_CHILDREN: scan for our children
        found = []
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat", "rb") as stat_file:
                    fields = stat_file.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == me:
                found.append(int(name))
        return found


def _kill(pid: int, signum: int) -> None:
    try:  # noqa: SIM105
        os.kill(pid, signum)
    except OSError:
        pass


def _wait(pid: int) -> None:
    try:  # noqa: SIM105
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _children_cpu() -> str:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return f"{usage.ru_utime + usage.ru_stime:.4f}"
