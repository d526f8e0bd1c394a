"""scripts/infra/node_cleanup.py: what a killed containerd leaves behind (its shims and their containers)
is found by the shim's `-address` under the node's state directory and killed; nothing else is."""

from __future__ import annotations

import importlib.util
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("node_cleanup", REPO / "scripts/infra/node_cleanup.py")
assert _spec and _spec.loader
node_cleanup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(node_cleanup)


def _fake_shim(sock: Path) -> subprocess.Popen[bytes]:
    """A bash named like containerd's shim, with `-address SOCK` as containerd passes it, and one child
    (the "container") that sleeps."""
    return subprocess.Popen(["bash", "-c", 'exec -a containerd-shim-runc-v2 bash -c "sleep 120 & wait" -address "$0"',
                             str(sock)])


def _wait_for(predicate, what: str, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not {what} after {timeout_s} s")


def test_orphan_shims_of_this_node_and_their_containers_are_killed_others_kept(tmp_path: Path) -> None:
    ours = _fake_shim(tmp_path / "node" / "containerd-state" / "containerd.sock")
    other = _fake_shim(tmp_path / "elsewhere" / "containerd.sock")
    try:
        container = _wait_for(lambda: [p for p in node_cleanup.children([ours.pid])  # forked and exec'd
                                       if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep")], "a container")
        assert node_cleanup.orphan_shims(str(tmp_path / "node")) == [ours.pid]
        killed = node_cleanup.kill_orphans(str(tmp_path / "node"))
        assert sorted(killed) == sorted([*container, ours.pid])
        ours.wait(timeout=10)  # gone (killed, or done once its container was)
        _wait_for(lambda: not Path(f"/proc/{container[0]}").exists()
                  or "Z" in Path(f"/proc/{container[0]}/stat").read_text().rsplit(")", 1)[1].split()[:1],
                  "the container gone")
        assert other.poll() is None, "a shim of another containerd was killed"
    finally:
        for p in (ours, other):
            for child in node_cleanup.children([p.pid]):
                subprocess.run(["kill", "-9", str(child)], check=False)
            p.kill()
            p.wait()
