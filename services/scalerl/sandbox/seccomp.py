"""A seccomp filter built with libseccomp (libseccomp.so.2, through ctypes): every system call is allowed
except the ones below, which fail with EPERM (Python raises PermissionError). Unprivileged: it needs only
no_new_privs, which libseccomp sets. Stdlib-only; `load()` raises `Unavailable` when the library is
missing, so the launcher can report the layer off and go on.

Denied: sockets of every family but AF_UNIX (no network: AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, ...);
io_uring (its operations would bypass this filter); debugging and reading other processes (ptrace,
process_vm_*, pidfd_getfd, kcmp, ...); namespaces and mounts (unshare, setns, clone with a CLONE_NEW*
flag, mount and the new mount API); leaving the process group or session (setsid, setpgid), so the group
kill reaches every descendant; kernel keys, BPF, perf, kexec, modules, swap, clocks, reboot; and acting on
other processes' limits, priorities, CPU affinity or memory placement (prlimit64, setpriority, ... with a
pid other than 0, the caller). clone3 answers ENOSYS (its flags sit in memory a filter cannot read), so
the C library falls back to clone, whose flags are checked."""

from __future__ import annotations

import ctypes
import errno

_ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_CMP_NE = 1
_CMP_MASKED_EQ = 7
_AF_UNIX = 1

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    "get_robust_list",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "setsid",
    "setpgid",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "vhangup",
    "uselib",
    "personality",
)
# (system call, argument index): denied unless that argument (a pid) is 0, the caller itself
OTHER_PROCESS = (
    ("prlimit64", 0),
    ("sched_setaffinity", 0),
    ("sched_setscheduler", 0),
    ("sched_setparam", 0),
    ("migrate_pages", 0),
    ("move_pages", 0),
    ("setpriority", 1),
    ("ioprio_set", 1),
)
_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)


class Unavailable(Exception):
    """libseccomp cannot be loaded here."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError as exc:
        raise Unavailable(f"libseccomp.so.2 not found ({exc})") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    return lib


def _add(lib: ctypes.CDLL, ctx: int, action: int, name: str, *cmps: tuple[int, int, int, int]) -> bool:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:  # not a system call of this architecture
        return False
    array = (_ArgCmp * max(1, len(cmps)))(*[_ArgCmp(*c) for c in cmps])
    rc = lib.seccomp_rule_add_array(ctx, action, number, len(cmps), array if cmps else None)
    if rc < 0:
        raise OSError(-rc, f"seccomp_rule_add({name}): {errno.errorcode.get(-rc, rc)}")
    return True


def load(signals_only_to: int = 0) -> str:
    """Install the filter on the calling thread (and all it starts, irrevocably); returns what it denies.

    `signals_only_to` (a pid), where nothing else keeps the code's signals in (no pid namespace, no uid of
    its own, Landlock < 6): signals go only to the caller's own process group (`kill(0, ...)`) and to the
    threads of process `signals_only_to` (the caller: raise, pthread_kill); any other target is EPERM."""
    lib = _library()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:
        eperm = _ACT_ERRNO | errno.EPERM
        denied = sum(_add(lib, ctx, eperm, name) for name in DENIED)
        denied += sum(_add(lib, ctx, eperm, name, (index, _CMP_NE, 0, 0)) for name, index in OTHER_PROCESS)
        _add(lib, ctx, eperm, "socket", (0, _CMP_NE, _AF_UNIX, 0))
        for flag in _CLONE_NEW:
            _add(lib, ctx, eperm, "clone", (0, _CMP_MASKED_EQ, flag, flag))
        _add(lib, ctx, _ACT_ERRNO | errno.ENOSYS, "clone3")
        if signals_only_to:
            _add(lib, ctx, eperm, "kill", (0, _CMP_NE, 0, 0))
            for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
                _add(lib, ctx, eperm, name, (0, _CMP_NE, signals_only_to, 0))
            for name in ("tkill", "pidfd_send_signal"):
                _add(lib, ctx, eperm, name)
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise OSError(-rc, f"seccomp_load: {errno.errorcode.get(-rc, rc)}")
    finally:
        lib.seccomp_release(ctx)
    v = lib.seccomp_version().contents
    signals = "; signals only to its own process group and threads" if signals_only_to else ""
    return (
        f"libseccomp {v.major}.{v.minor}.{v.micro}: {denied} system calls denied, sockets other than "
        f"AF_UNIX, clone with namespace flags{signals}"
    )
