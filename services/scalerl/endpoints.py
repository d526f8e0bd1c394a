"""Checks of the addresses and output paths a command is given, made before any work (no I/O beyond
`os.access`/`stat` on paths, no third-party imports): each returns None when the value is usable, else
one line naming the option, the value and what is allowed, for the command to print and exit 2.

    bus_problem("--bus", "kafka://localhost:notaport")
    -> "--bus 'kafka://localhost:notaport': port 'notaport' is not a number 1-65535; allowed: ..."
"""

from __future__ import annotations

import os
import re
from pathlib import Path

BUS_FORMS = "memory:// (one process) or kafka://HOST:PORT[,HOST:PORT...]"
STORE_FORMS = "s3://BUCKET[/PREFIX], file:///ABSOLUTE/PATH or an absolute path"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3 bucket naming rules (3-63 characters)
_HOST = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_]([A-Za-z0-9._-]*[A-Za-z0-9_])?)$")


def host_port_problem(text: str) -> str | None:
    """Why `text` is not HOST:PORT (port 1-65535), or None."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        return f"{text!r} is not HOST:PORT"
    if not _HOST.match(host):
        return f"host {host!r} is not a host name or address"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"port {port!r} is not a number 1-65535"
    return None


GRPC_TARGET_FORMS = "dns:///HOST:PORT, ipv4:HOST:PORT[,HOST:PORT...] or HOST:PORT"


def grpc_target_problem(option: str, target: str) -> str | None:
    """`target` as a gRPC target naming one or more replicas: dns:///HOST:PORT (every address the name
    resolves to), ipv4:HOST:PORT[,HOST:PORT...] or HOST:PORT."""
    if target.startswith("dns:///"):
        addresses = [target.removeprefix("dns:///")]
    elif target.startswith("ipv4:"):
        addresses = target.removeprefix("ipv4:").split(",")
    elif "://" in target or target.split(":", 1)[0] in ("dns", "unix", "ipv6", "unix-abstract", "vsock"):
        return f"{option} {target!r}: unknown scheme; allowed: {GRPC_TARGET_FORMS}"
    else:
        addresses = [target]
    for address in addresses:
        why = host_port_problem(address.strip())
        if why:
            return f"{option} {target!r}: {why}; allowed: {GRPC_TARGET_FORMS}"
    return None


def bus_problem(option: str, url: str, *, allow_memory: bool = True) -> str | None:
    """`url` as a bus address: memory:// or kafka://HOST:PORT[,HOST:PORT...]."""
    forms = BUS_FORMS if allow_memory else "kafka://HOST:PORT[,HOST:PORT...] (memory:// lives in one process)"
    if url == "memory://" and allow_memory:
        return None
    if not url.startswith("kafka://"):
        return f"{option} {url!r}: unknown scheme; allowed: {forms}"
    brokers = url.removeprefix("kafka://").split(",")
    for broker in brokers:
        why = host_port_problem(broker.strip())
        if why:
            return f"{option} {url!r}: {why}; allowed: {forms}"
    return None


def store_problem(option: str, url: str) -> str | None:
    """`url` as a store address: s3://BUCKET[/PREFIX], file:///PATH or an absolute path."""
    if url.startswith("s3://"):
        bucket = url.removeprefix("s3://").split("/", 1)[0]
        if not _BUCKET.match(bucket):
            what = "no bucket" if not bucket else f"bucket {bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)"
            return f"{option} {url!r}: {what}; allowed: {STORE_FORMS}"
        return None
    path = url.removeprefix("file://")
    if "://" in path or not path.startswith("/"):
        return f"{option} {url!r}: not an absolute path or a known scheme; allowed: {STORE_FORMS}"
    return None


def target_problem(option: str, text: str | None) -> str | None:
    """`text` as a service address HOST:PORT."""
    if not text:
        return f"{option}: missing; allowed: HOST:PORT (port 1-65535)"
    why = host_port_problem(text)
    return f"{option} {text!r}: {why}; allowed: HOST:PORT (port 1-65535)" if why else None


def output_file_problem(option: str, path: str | Path) -> str | None:
    """`path` as a file to write: its folder exists and is writable, and it is not a folder itself."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        return f"{option} {str(path)!r}: is a folder; allowed: a file path in an existing writable folder"
    if not parent.is_dir():
        return f"{option} {str(path)!r}: folder {str(parent)!r} does not exist; allowed: a file in an existing folder"
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        return f"{option} {str(path)!r}: not writable; allowed: a file path you may write"
    return None


def output_dir_problem(option: str, path: str | Path) -> str | None:
    """`path` as a folder to create or fill: it is a writable folder, or its nearest existing ancestor is."""
    p = Path(path).absolute()
    if p.exists():
        if not p.is_dir():
            return f"{option} {str(path)!r}: is a file; allowed: a folder (existing or to be created)"
        return None if os.access(p, os.W_OK | os.X_OK) else f"{option} {str(path)!r}: folder not writable"
    ancestor = next(a for a in p.parents if a.exists())
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        return (f"{option} {str(path)!r}: cannot be created under {str(ancestor)!r} (not a writable folder); "
                "allowed: a folder path you may write")
    return None
