"""The broadcast path (scalerl.weightsync.broadcast) over real torch.distributed (gloo on loopback).

The learner pushes each version before it uploads it. Generators whose readers take the pushed objects
build every version bit-identical to the learner's weights without downloading a shard or a manifest; a
pushed shard that does not match the manifest is downloaded instead, a pushed manifest that does not match
the announcement is read from the store; a reader outside the group waits for the upload in progress; a
version announced whose upload never ends keeps its number; a generator that stops responding (SIGSTOP, in
a process of its own) is named by the learner, which does not wait past its timeouts, and it recovers
through the store and rejoins the group."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from broadcast_member import bits_digest
from test_weightsync import FakeLearner, assert_bits_equal

from scalerl.store.local import LocalStore
from scalerl.weightsync import publisher as publisher_module
from scalerl.weightsync.broadcast import BroadcastHub, BroadcastReceiver, BroadcastSettings
from scalerl.weightsync.codec import CodecError, encode
from scalerl.weightsync.manifest import PENDING, parse_key
from scalerl.weightsync.publisher import WeightPublisher
from scalerl.weightsync.reader import WeightReader, WeightsUnavailable, highest_version
from waiting import wait_for

# one_kernel: the weights are copied bit for bit and the timeouts are of transport, whatever the kernels
pytestmark = pytest.mark.one_kernel
MEMBER = Path(__file__).with_name("broadcast_member.py")
START_S = 240.0  # a process importing torch on a loaded 2-core machine: 30 s seen


@pytest.fixture
def hub():
    h = BroadcastHub(BroadcastSettings("127.0.0.1", 0, timeout_s=3.0))
    yield h
    h.close()


def pushed_by(hub: BroadcastHub):
    """A `before_upload` that sends the version to the hub's group (the learner's announcement follows)."""
    def push(pv, parts) -> None:
        assert hub.send(pv.version, parts), f"version {pv.version} not sent to the group"
    return push


def test_members_build_every_version_from_the_pushed_objects_and_a_bad_one_comes_from_the_store(
        tmp_path, hub, caplog) -> None:
    store = LocalStore(tmp_path / "store")
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=8192)
    learner = FakeLearner()
    readers = [WeightReader(store) for _ in range(2)]
    settings = BroadcastSettings("127.0.0.1", hub.port, timeout_s=3.0)
    tamper = {"on": ""}

    def deliver(reader: WeightReader):
        def put(version: int, objects: dict[str, bytes]) -> None:
            (key, data), = objects.items()
            if reader is readers[1] and tamper["on"] and key.endswith(tamper["on"]):  # arrives wrong
                objects = {key: bytes([data[0] ^ 1]) + bytes(data[1:])}
            reader.offer_shards(version, objects)
        return put

    receivers = [BroadcastReceiver(settings, f"gen-{i}", deliver(r), r.push_ended) for i, r in enumerate(readers)]
    try:
        wait_for("both generators in the group", lambda: hub.members == 2, timeout_s=30)
        for v in range(1, 5):
            if v > 1:
                learner.step()
            # version 1 (a snapshot: several shards): one shard arrives wrong at gen-1; version 2: its manifest
            tamper["on"] = {1: "shard-0001", 2: "manifest.json"}.get(v, "")
            early = [0] if tamper["on"] else [0, 1]  # (a tampered object comes from the store: after the upload)

            def push_then_fetch(pv, parts, early=early) -> None:
                pushed_by(hub)(pv, parts)
                assert not store.list(store.key_of(pv.uri).rsplit("/", 1)[0]), "nothing of the version is uploaded yet"
                for i in early:
                    assert_bits_equal(readers[i].fetch(pv), learner.expected(torch.bfloat16))

            with caplog.at_level(logging.WARNING, logger="scalerl.weightsync.reader"):
                pv = pub.publish(v, learner.state(), before_upload=push_then_fetch)
            for i, reader in enumerate(readers):
                if i not in early:
                    assert_bits_equal(reader.fetch(pv), learner.expected(torch.bfloat16))
                shard_bytes = sum(s.bytes for s in reader.held.shards)  # type: ignore[union-attr]
                if v == 1 and i == 1:  # the tampered shard was downloaded, the others pushed
                    got = reader.stats
                    assert 0 < got.bytes < shard_bytes and got.pushed == shard_bytes - got.bytes
                else:
                    assert (reader.stats.bytes, reader.stats.pushed) == (0, shard_bytes), (v, i)
        warned = [r.getMessage() for r in caplog.records]
        assert sum("shard-0001 received by broadcast does not match" in w for w in warned) == 1, warned
        assert sum("manifest.json received by broadcast" in w for w in warned) == 1, warned
        assert (hub.sent, hub.failed, hub.skipped) == (4, 0, 0)
        assert [r.received for r in receivers] == [4, 4]
    finally:
        for r in receivers:
            r.close()


def test_a_reader_outside_the_group_waits_for_the_upload_of_an_announced_version(tmp_path) -> None:
    store = LocalStore(tmp_path / "store")
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=8192)
    learner = FakeLearner()
    waiting, impatient = WeightReader(store, manifest_wait_s=30.0), WeightReader(store)
    results: dict[str, object] = {}

    def fetch(name: str, reader: WeightReader, pv) -> None:
        try:
            results[name] = reader.fetch(pv)
        except Exception as exc:  # the test reads what it was
            results[name] = exc

    def announce(pv, parts) -> None:  # announced, not yet uploaded: no one pushed it to these readers
        assert not store.exists(store.key_of(pv.uri))
        threads = [threading.Thread(target=fetch, args=("waiting", waiting, pv)),
                   threading.Thread(target=fetch, args=("impatient", impatient, pv))]
        for t in threads:
            t.start()
        threads[1].join(timeout=30)
        results["threads"] = threads
        time.sleep(0.3)  # the upload is slow: the waiting reader is still waiting
        assert "waiting" not in results

    pub.publish(1, learner.state(), before_upload=announce)
    results["threads"][0].join(timeout=30)  # type: ignore[index]
    assert isinstance(results["impatient"], WeightsUnavailable), results["impatient"]
    assert_bits_equal(results["waiting"], learner.expected(torch.bfloat16))  # type: ignore[arg-type]
    assert waiting.stats.bytes == sum(s.bytes for s in pub.last.shards)  # type: ignore[union-attr]
    assert highest_version(store) == 1 and not store.list(PENDING)  # the marker goes once the manifest is there


def test_a_version_announced_whose_upload_never_ends_keeps_its_number(tmp_path) -> None:
    store = LocalStore(tmp_path / "store")
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=8192)
    learner = FakeLearner()
    pub.publish(1, learner.state())

    def die(pv, parts) -> None:  # the learner dies between the announcement and the upload
        raise KeyboardInterrupt

    learner.step()
    with pytest.raises(KeyboardInterrupt):
        pub.publish(2, learner.state(), before_upload=die)
    assert [parse_key(k) is not None for k in store.list("policy/v")].count(True) == 1  # only v1's manifest
    assert highest_version(store) == 2  # a resumed learner numbers past it (scalerl.learner.lineage)
    pub.publish(3, learner.state())
    assert highest_version(store) == 3 and not store.list(PENDING)


def test_a_delta_that_fails_to_encode_is_never_announced_and_the_group_goes_on(tmp_path, hub, monkeypatch) -> None:
    """A delta's manifest goes last, so an encoding error stops it before its announcement (a snapshot's goes
    first: the pending marker then keeps its number, as for a learner that dies after announcing)."""
    store = LocalStore(tmp_path / "store")
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=8192, snapshot_every=100)
    learner, reader = FakeLearner(), WeightReader(store)
    receiver = BroadcastReceiver(BroadcastSettings("127.0.0.1", hub.port, timeout_s=3.0), "gen-0", reader.offer_shards,
                                 reader.push_ended)
    announced: list[int] = []

    def push_and_announce(pv, parts) -> None:
        hub.send_and_announce(pv.version, parts, lambda: announced.append(pv.version))

    try:
        wait_for("the generator in the group", lambda: hub.members == 1, timeout_s=30)
        pub.publish(1, learner.state(), before_upload=push_and_announce)
        calls = {"n": 0}

        def encode_fails_at_the_fourth_chunk(new, old):
            calls["n"] += 1
            if calls["n"] == 4:
                raise CodecError("the fourth chunk cannot be encoded")
            return encode(new, old)

        monkeypatch.setattr(publisher_module, "encode", encode_fails_at_the_fourth_chunk)
        learner.step()
        with pytest.raises(CodecError, match="fourth chunk"):
            pub.publish(2, learner.state(), before_upload=push_and_announce)
        assert announced == [1] and highest_version(store) == 2  # never announced; its number is taken
        monkeypatch.undo()
        # the receiver was mid-version: it times out, rejoins, and the next version reaches it by broadcast
        wait_for("the group formed again", lambda: hub.members == 1 and receiver.in_group, timeout_s=30)
        pv = pub.publish(3, learner.state(), before_upload=push_and_announce)
        assert_bits_equal(reader.fetch(pv), learner.expected(torch.bfloat16))
        assert reader.stats.bytes == 0 and reader.stats.pushed > 0 and announced == [1, 3]
    finally:
        receiver.close()


class Member:
    """A generator process (broadcast_member.py): fetch(pv) -> what it built and from where."""

    def __init__(self, store_dir: Path, port: int, member_id: str, timeout_s: float) -> None:
        self.id = member_id
        self.proc = subprocess.Popen([sys.executable, str(MEMBER), str(store_dir), str(port), member_id,
                                      str(timeout_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]

    def fetch(self, pv) -> dict:
        self.proc.stdin.write(json.dumps(asdict(pv)) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.lines.get(timeout=START_S))

    def close(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(timeout=30)


def test_a_stopped_generator_is_named_the_learner_does_not_wait_past_its_timeout_and_it_recovers(
        tmp_path, hub, caplog) -> None:
    timeout_s = 3.0
    store = LocalStore(tmp_path / "store")
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=8192)
    learner = FakeLearner()
    members = [Member(tmp_path / "store", hub.port, f"gen-{c}", timeout_s) for c in "ab"]
    a, b = members

    sent: list[bool] = []

    def version(v: int):
        if v > 1:
            learner.step()
        pv = pub.publish(v, learner.state(), before_upload=lambda pv, parts: sent.append(hub.send(v, parts)))
        return pv, bits_digest(learner.expected(torch.bfloat16))

    try:
        wait_for("both generators in the group", lambda: hub.members == 2, timeout_s=START_S)
        pv, want = version(1)
        assert sent[-1]
        for m in members:
            got = m.fetch(pv)
            assert got["digest"] == want and got["downloaded"] == 0 and got["pushed"] > 0, (m.id, got)

        os.kill(b.proc.pid, signal.SIGSTOP)  # gen-b stops responding
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="scalerl.weightsync.broadcast"):
            pv, want = version(2)
            assert not sent[-1]
        took = time.monotonic() - t0
        assert took < 3 * timeout_s + 2, f"the learner waited {took:.1f} s"
        assert dict(hub.stuck) == {"gen-b": 1}
        assert any("stuck: gen-b" in r.getMessage() for r in caplog.records), caplog.text
        got = a.fetch(pv)  # the version the group missed: from the store
        assert got["digest"] == want and got["downloaded"] > 0 and got["pushed"] == 0, got

        wait_for("the group rebuilt with gen-a", lambda: hub.members == 1, timeout_s=30)
        pv, want = version(3)
        assert sent[-1]
        got = a.fetch(pv)
        assert got["digest"] == want and got["downloaded"] == 0, got

        os.kill(b.proc.pid, signal.SIGCONT)  # gen-b is back: it builds what it missed from the store
        got = b.fetch(pv)
        assert got["digest"] == want and got["downloaded"] > 0, got
        wait_for("gen-b back in the group", lambda: hub.members == 2, timeout_s=60)
        pv, want = version(4)
        assert sent[-1]
        for m in members:
            got = m.fetch(pv)
            assert got["digest"] == want and got["downloaded"] == 0 and got["pushed"] > 0, (m.id, got)
        # what came by broadcast: gen-a every version but 2, gen-b versions 1 and 4
        assert [m.fetch(pv)["received"] for m in members] == [3, 2]
        assert (hub.sent, hub.failed) == (3, 1)
    finally:
        for m in members:
            m.close()


def test_a_receiver_whose_learner_is_gone_closes_promptly_between_tries() -> None:
    """With no learner at its port (gone at the end of a run), a receiver retries the connect in short
    slices, so `close` joins its thread instead of leaving it inside torch's native connect loop, where
    the interpreter's finalization would abort the process (SIGABRT) when the call returns."""
    from scalerl.weightsync import broadcast

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    receiver = BroadcastReceiver(BroadcastSettings("127.0.0.1", port, timeout_s=60.0), "gen-gone",
                                 lambda v, shards: None)
    time.sleep(1.5)  # inside a try, or between two
    t0 = time.monotonic()
    receiver.close()
    took = time.monotonic() - t0
    assert not receiver._thread.is_alive() and broadcast.stranded_threads() == [], f"close took {took:.1f} s"
    assert took < broadcast.CLOSE_WAIT_S


STRANDED_CHILD = """
import datetime, sys, threading, time
from torch._C._distributed_c10d import TCPStore
from scalerl import cli
from scalerl.weightsync import wire

def connect_forever():  # in native code for 0.2 s at a time, many returns during finalization
    while True:
        try:
            TCPStore("127.0.0.1", int(sys.argv[1]), None, False, datetime.timedelta(seconds=0.2))
        except Exception:
            pass

t = threading.Thread(target=connect_forever, name="stuck-transfer", daemon=True)
t.start()
wire._STRANDED.append(t)
time.sleep(0.5)
print("flushed before leaving", flush=False)
cli._leave_past_stranded_threads(3)
"""


def test_the_cli_leaves_without_finalization_while_a_broadcast_thread_is_stranded() -> None:
    """A thread that `close` could not join: the CLI flushes and exits with the command's code, without
    the interpreter's finalization (under which such a thread aborts the process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-c", STRANDED_CHILD, str(port)], capture_output=True, text=True,
                          timeout=START_S)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "flushed before leaving" in proc.stdout
    assert "leaving without finalization: stuck-transfer still in a transfer" in proc.stderr


def test_a_pushed_snapshot_is_announced_with_its_manifest_and_built_while_its_shards_stream(tmp_path, hub) -> None:
    """A snapshot's manifest goes first: the learner announces it before any shard has gone, and a generator
    that starts building then waits for the manifest and takes each shard as it arrives (it downloads none;
    nothing is uploaded yet)."""
    store = LocalStore(tmp_path / "store")
    pub = WeightPublisher(store, torch.bfloat16, shard_bytes=8192, delta=False)
    learner, reader = FakeLearner(), WeightReader(store, manifest_wait_s=60)
    receiver = BroadcastReceiver(BroadcastSettings("127.0.0.1", hub.port, timeout_s=30.0), "gen-0", reader.offer_shards,
                                 reader.push_ended)
    seen: dict[str, object] = {}

    def build(pv) -> None:
        try:
            seen["weights"] = reader.fetch(pv)
        except Exception as exc:  # reported by the assertions below
            seen["error"] = exc

    def push_and_announce(pv, parts) -> None:
        def announce() -> None:
            seen["at_announce"] = [k for k in reader.inbox._objects if "shard-" in k]
            seen["builder"] = threading.Thread(target=build, args=(pv,))
            seen["builder"].start()  # type: ignore[attr-defined]

        assert hub.send_and_announce(pv.version, parts, announce)
        seen["builder"].join(timeout=60)  # type: ignore[attr-defined]
        seen["uploaded"] = store.list("policy/v")

    try:
        wait_for("the generator in the group", lambda: hub.members == 1, timeout_s=30)
        pub.publish(1, learner.state(), before_upload=push_and_announce)
        assert pub.last is not None and len(pub.last.shards) >= 3
        assert seen["at_announce"] == []  # announced before any shard had gone
        assert "error" not in seen, seen.get("error")
        assert_bits_equal(seen["weights"], learner.expected(torch.bfloat16))  # type: ignore[arg-type]
        assert reader.stats.bytes == 0 and reader.stats.pushed == pub.last.stored_bytes
        assert seen["uploaded"] == [], "built before the upload began"
    finally:
        receiver.close()


def test_a_shard_that_a_push_did_not_bring_is_downloaded_once_the_upload_is_there(tmp_path) -> None:
    """A fetch waits for a pushed version's shards while its push is under way; when the push ends without
    them (a failed transfer), it downloads them once the version's manifest (written last) is in the store."""
    store = LocalStore(tmp_path / "store")
    learner = FakeLearner()
    pv = WeightPublisher(store, torch.bfloat16, shard_bytes=8192, delta=False).publish(1, learner.state())
    key = store.key_of(pv.uri)
    manifest = store.get_bytes(key)
    store.delete(key)  # the upload of its shards is done, its manifest not yet
    reader = WeightReader(store, manifest_wait_s=60)
    reader.offer_shards(1, {key: manifest})  # the manifest came by broadcast, its shards are on their way
    built: dict[str, object] = {}
    t = threading.Thread(target=lambda: built.update(w=reader.fetch(pv)))
    t.start()
    time.sleep(0.5)
    assert t.is_alive(), "it did not wait for the shards of a push under way"
    reader.push_ended(1)  # the push failed: no shard will come
    time.sleep(0.5)
    assert t.is_alive(), "it downloaded before the version's upload ended"
    store.put_bytes(key, manifest)
    t.join(timeout=60)
    assert_bits_equal(built["w"], learner.expected(torch.bfloat16))  # type: ignore[arg-type]
    assert reader.stats.pushed == 0 and reader.stats.bytes > 0
