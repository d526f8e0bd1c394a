"""Undo what the real test node (scripts/infra/node.sh) did to the host. Run by node.sh, as root.

    node_cleanup.py snapshot FILE           the iptables/ip6tables chains that exist now (before the node)
    node_cleanup.py containers SOCKET       kill and remove every container of containerd's k8s.io namespace
    node_cleanup.py host STATE BRIDGE       kill containerd shims left by a killed containerd of STATE;
                                            unmount what is mounted under STATE, the containerd cache root
                                            and /run/netns/cni-*; delete BRIDGE; delete the KUBE-*/CNI-*
                                            chains that were not in STATE/iptables.before (and the rules
                                            that jump to them); restore the sysctls of STATE/sysctl.saved

Every step is idempotent and best effort per item: one that fails is reported on stderr and the rest
still run; the exit status is 1 when anything could not be undone.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

TABLES = ("filter", "nat", "mangle", "raw")
OURS = re.compile(r"^(KUBE-|CNI-)")
problems: list[str] = []


def run(*argv: str, check: bool = True) -> str:
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode != 0:
        problems.append(f"{' '.join(argv)}: {p.stderr.strip() or p.returncode}")
    return p.stdout


def chains(tool: str) -> dict[str, list[str]]:
    """table -> its chain names, from `<tool>-save`."""
    out: dict[str, list[str]] = {}
    table = ""
    for line in run(f"{tool}-save", check=False).splitlines():
        if line.startswith("*"):
            table = line[1:]
            out.setdefault(table, [])
        elif line.startswith(":"):
            out.setdefault(table, []).append(line[1:].split()[0])
    return out


NETNS = "/run/netns"


def is_mount(path: str) -> bool:
    return any(line.split()[4] == path for line in Path("/proc/self/mountinfo").read_text().splitlines())


def snapshot(path: str) -> None:
    Path(path).write_text(json.dumps({**{tool: chains(tool) for tool in ("iptables", "ip6tables")},
                                      "netns_mounted": is_mount(NETNS)}))


def remove_chains(tool: str, before: dict[str, list[str]]) -> int:
    """Delete the KUBE-*/CNI-* chains of `tool` that `before` lacks, and the rules jumping to them."""
    removed = 0
    table = ""
    rules: dict[str, list[str]] = {}
    for line in run(f"{tool}-save", check=False).splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A "):
            rules.setdefault(table, []).append(line)
    for table, names in chains(tool).items():
        new = [c for c in names if OURS.match(c) and c not in before.get(table, [])]
        if not new:
            continue
        for rule in rules.get(table, []):  # the rules in the surviving chains that jump to a new chain
            parts = rule.split()
            target = parts[parts.index("-j") + 1] if "-j" in parts else ""
            if target in new and parts[1] not in new:
                run(tool, "-t", table, "-D", *shlex.split(rule)[1:])  # iptables-save quotes comments
        for c in new:
            run(tool, "-t", table, "-F", c)
        for c in new:
            run(tool, "-t", table, "-X", c)
            removed += 1
    return removed


def mounts_under(prefixes: list[str]) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].encode().decode("unicode_escape")
        if any(target == p or target.startswith(p.rstrip("/") + "/") for p in prefixes):
            out.append(target)
    return sorted(set(out), key=len, reverse=True)


def containers(sock: str) -> None:
    ctr = ["ctr", "--address", sock, "-n", "k8s.io"]
    for task in run(*ctr, "tasks", "ls", "-q", check=False).split():
        run(*ctr, "tasks", "kill", "-s", "SIGKILL", task, check=False)
    for task in run(*ctr, "tasks", "ls", "-q", check=False).split():
        run(*ctr, "tasks", "delete", "-f", task, check=False)
    for c in run(*ctr, "containers", "ls", "-q", check=False).split():
        run(*ctr, "containers", "rm", c, check=False)


def orphan_shims(state: str) -> list[int]:
    """Pids of containerd shims serving a containerd whose socket lies under `state`: they outlive a
    containerd that was killed (a `make test` stopped by a signal) and keep the Pods' network
    namespaces, so /run/netns could not be unmounted."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not Path(argv[0].decode(errors="replace")).name.startswith("containerd-shim"):
            continue
        address = argv[argv.index(b"-address") + 1].decode(errors="replace") if b"-address" in argv[:-1] else ""
        if address.startswith(state.rstrip("/") + "/"):
            pids.append(int(proc.name))
    return pids


def children(parents: list[int]) -> list[int]:
    """Pids whose parent is in `parents` (from /proc/PID/stat)."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid in parents:
            out.append(int(proc.name))
    return out


def kill_orphans(state: str) -> list[int]:
    """SIGKILLs the containers' first processes under orphan shims of `state`, then the shims; their pids."""
    shims = orphan_shims(state)
    killed = []
    for pid in [*children(shims), *shims]:
        try:
            os.kill(pid, 9)
            killed.append(pid)
            print(f"node: killed {pid}, left by a containerd that is gone", file=sys.stderr)
        except ProcessLookupError:
            pass
    return killed


def host(state: str, bridge: str) -> None:
    st = Path(state)
    kill_orphans(state)
    cache_root = os.environ.get("SCALERL_CACHE", str(Path.home() / ".cache" / "scalerl")) + "/containerd"
    for target in mounts_under([state, cache_root]):
        run("umount", "-l", target)
    for ns in Path(NETNS).glob("cni-*") if Path(NETNS).is_dir() else []:
        run("umount", "-l", str(ns), check=False)
        ns.unlink(missing_ok=True)
    if Path(f"/sys/class/net/{bridge}").exists():
        run("ip", "link", "delete", bridge)
    before_file = st / "iptables.before"
    if before_file.exists():
        before = json.loads(before_file.read_text())
        n = sum(remove_chains(tool, before.get(tool, {})) for tool in ("iptables", "ip6tables"))
        print(f"node: removed {n} iptables/ip6tables chains", file=sys.stderr)
        # containerd makes /run/netns a shared bind mount of itself; undone when it was not one before
        if not before.get("netns_mounted", True) and is_mount(NETNS) and not any(Path(NETNS).iterdir()):
            run("umount", NETNS)
    saved = st / "sysctl.saved"
    if saved.exists():
        for line in saved.read_text().splitlines():
            key, _, value = line.partition("=")
            if value:
                run("sysctl", "-qw", f"{key}={value}")
    if not problems:
        for leftover in (before_file, saved):
            leftover.unlink(missing_ok=True)
        for d in ("cni/ipam", "kubelet", "containerd-state"):
            shutil.rmtree(st / d, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "snapshot":
        snapshot(argv[1])
    elif len(argv) == 2 and argv[0] == "containers":
        containers(argv[1])
    elif len(argv) == 3 and argv[0] == "host":
        host(argv[1], argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for p in problems:
        print(f"node cleanup: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
