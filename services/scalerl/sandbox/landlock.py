"""Landlock (Linux >= 5.13, unprivileged, so it works in a Pod) through raw syscalls: after `restrict`, the
calling process and everything it starts can read only below the given read paths, write only below the
given write paths, open no TCP connection and bind no TCP port (ABI >= 4), and signal or reach abstract
unix sockets of no process outside its own domain (ABI >= 6). Best effort by ABI, as the kernel
documentation recommends: the rights an older kernel does not know are left out. Stdlib-only."""

from __future__ import annotations

import ctypes
import os
import stat

from scalerl.sandbox import linux

_SYS_CREATE_RULESET = 444  # the same number on every architecture (asm-generic)
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1

READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (
    READ_FILE
    | READ_DIR
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # what a rule on a non-directory may hold


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 when Landlock is absent or disabled (ENOSYS, EOPNOTSUPP)."""
    try:
        return linux.syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    except OSError:
        return 0


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def restrict(rules: list[tuple[str, int]], abi: int) -> str:
    """Allow each (path, rights) of `rules` (missing paths are skipped) and deny every other handled access,
    for this process and its future children, irrevocably. The caller sets no_new_privs first. Returns
    what was restricted, for the layer report."""
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        size = 24
    ruleset = linux.syscall(_SYS_CREATE_RULESET, ctypes.c_void_p(ctypes.addressof(attr)), size, 0)
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                allowed = rights & handled
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    allowed &= _FILE_RIGHTS
                rule = _PathBeneathAttr(allowed, fd)
                linux.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.c_void_p(ctypes.addressof(rule)), 0)
            finally:
                os.close(fd)
        linux.syscall(_SYS_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)
    parts = ["filesystem"]
    if abi >= 4:
        parts.append("TCP bind/connect")
    if abi >= 6:
        parts.append("signals and abstract unix sockets outside the sandbox")
    return f"ABI {abi}: " + ", ".join(parts)
