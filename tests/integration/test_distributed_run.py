"""The roles as separate processes over the real Kafka broker and MinIO, with faults injected mid-run.

One run (curriculum, two generators, two verifiers, a learner; PipelineRL-2) in which:
- generator-0 is killed with SIGKILL: its uncommitted prompts go to generator-1;
- the learner is killed with SIGKILL after its step-4 checkpoint and started again: it resumes from the
  checkpoint in MinIO and its saved offsets;
- the broker is restarted: every role reconnects and carries on;
- poison records are written to the rollouts and scored topics: they land in the dead-letter topic.
The resumed learner never announces a version number again (it numbers past the highest one uploaded);
rollouts of the versions announced after its checkpoint (the lost lineage) are dropped as stale, as they
arrive (listed in the next step's record), and its announcements let the curriculum issue prompts again.
Then the accounting is checked against the scored topic itself: the groups below the learner's final
positions are exactly the groups of the training steps, trained or dropped (each in one step), plus
duplicates counted.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import time

import pytest

from distributed_checks import assert_committed_have_output, steps_of, wait_step
from scalerl.bus.kafka import KafkaBus
from scalerl.messages import PolicyVersion, RolloutGroup, ScoredGroup
from scalerl.model.sources import model_vocab_size
from scalerl.rpc.convert import decode_envelope
from scalerl.runtime.launcher import LocalCluster
from scalerl.store.factory import open_store
from scalerl.weightsync.manifest import parse_key
from scalerl.weightsync.reader import highest_version
from sideport_client import side_get
from waiting import wait_for

pytestmark = [pytest.mark.infra, pytest.mark.distributed]

STEPS = 10


# PipelineRL-2 over two partitions, a checkpoint every 4 steps (the learner is killed after step 4); weights
# published in bf16 as deltas with a snapshot every 3 versions, so the kills meet chains of deltas, and also
# pushed to the generators' broadcast group (a killed generator holds one transfer up for at most 5 s)
RUN = {"steps": STEPS, "off_policy": {"mode": "pipeline", "k": 2}, "checkpoint_every": 4, "eval_every": 5,
       "partitions": 2, "weight_sync": {"dtype": "bfloat16", "snapshot_every": 3,
                                        "broadcast": {"enabled": True, "timeout_s": 5}}}


@pytest.fixture
def sft_start(mixed_start) -> str:
    """One warm start whose groups have mixed rewards by construction (checked), shared by the session."""
    return mixed_start


@pytest.mark.timeout(900)
def test_distributed_run_survives_kills_and_broker_restart(infra, s3_env, unique, sft_start, tmp_path,
                                                           private_kafka, restart_kafka, addition_run_spec):
    """(On a broker of its own, `private_kafka`, since it restarts it.)"""
    spec = addition_run_spec(unique, sft_start, **RUN)
    out = tmp_path / "run"
    cluster = LocalCluster(spec, out, f"kafka://{private_kafka.bootstrap}", f"s3://{unique}/job",
                           generators=2, verifiers=2, env=infra.s3_env())
    bus = KafkaBus(private_kafka.bootstrap)
    try:
        cluster.start_all()
        wait_step(cluster, out, 2)
        # both generators in the learner's broadcast group first (it forms within seconds of the first publish;
        # a learner on a backlog of rollouts can reach step 2 sooner), so that the kill is a member's death
        wait_for("the broadcast group with both generators", lambda: "formed with 2 generator(s)"
                 in cluster.procs["learner-0"].log_path.read_text(), timeout_s=120)
        cluster.kill("generator-0")  # SIGKILL mid-run; not restarted
        bus.publish_raw(f"{unique}.rollouts", b"\x00poison-rollout", key=b"p")
        bus.publish_raw(f"{unique}.scored", b"\x00poison-scored", key=b"p")
        bus.flush()
        wait_step(cluster, out, 5)  # the step-4 checkpoint is in MinIO
        cluster.kill("learner-0")
        before_kill = _announced(bus, unique)  # versions 5.. of this learner die with it (lost lineage)
        uploaded = highest_version(open_store(f"s3://{unique}/job"))  # its last upload may be unannounced
        cluster.start("learner", "learner-0")
        restart_kafka()
        assert cluster.wait_learner(timeout_s=480) == 0, cluster.tail("learner-0")
        # (checked at the end: waiting for it mid-run could let the learner finish before it is killed)
        _check_side_port(cluster, "generator-1", f"{unique}.prompts", broadcast=True)
        _check_grpc_is_mutual_tls(cluster, "generator-1")
        codes = cluster.stop_all()
    finally:
        cluster.stop_all(timeout_s=30)
    assert codes["generator-0"] == -signal.SIGKILL
    assert {rid: rc for rid, rc in codes.items() if rid != "generator-0"} == {
        "learner-0": 0, "curriculum-0": 0, "verifier-0": 0, "verifier-1": 0, "generator-1": 0}
    learner_log = cluster.procs["learner-0"].log_path.read_text()
    assert "learner resumed from step_000004" in learner_log
    # the broadcast group: the killed generator was named, the group was formed again by the restarted learner
    assert "stuck: generator-0" in learner_log, learner_log[-3000:]
    resumed = learner_log[learner_log.index("learner resumed from step_000004"):]
    assert "weights broadcast: generation" in resumed and "formed with" in resumed

    summary = json.loads((out / "summary.json").read_text())
    steps = steps_of(out)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1)) and summary["steps"] == STEPS
    trained = [gid for r in steps for gid in r["group_ids"]]
    assert len(trained) == STEPS * spec.train.prompts_per_step
    dropped = [gid for r in steps for gid in r["dropped_group_ids"]]  # before they took a place in a batch
    assert len(set(trained + dropped)) == len(trained) + len(dropped), "a group was counted twice"
    assert sum(r["effective_batch"] for r in steps) > 0  # some groups had mixed rewards: real updates
    assert all(r["loss"] != 0 for r in steps if r["effective_batch"]), "a step with data left the loss at 0"

    # The scored topic below the learner's final positions holds exactly the groups of the steps, trained or
    # dropped (+ duplicates).
    final = summary["final_positions"]
    below: list[str] = []
    for rec in bus.read_raw(f"{unique}.scored"):
        if rec.offset >= final.get(f"{unique}.scored:{rec.partition}", 0) or rec.value.startswith(b"\x00"):
            continue
        group = decode_envelope(rec.value, ScoredGroup)
        below.append(group.group_id)
    assert set(below) == set(trained) | set(dropped)
    assert len(below) - len(set(below)) == summary["duplicates_dropped"]

    # Nothing lost: every prompt the generators committed has a rollout group (the killed generator's
    # uncommitted prompts were re-delivered), every rollout the verifiers committed has a score.
    assert_committed_have_output(bus, f"{unique}.prompts", f"{unique}.generators", f"{unique}.rollouts",
                                  lambda m: f"{m.prompt_id}@{m.epoch}", lambda m: f"{m.task.prompt_id}@{m.task.epoch}")
    assert_committed_have_output(bus, f"{unique}.rollouts", f"{unique}.verifiers", f"{unique}.scored",
                                  lambda m: f"{m.task.prompt_id}@{m.task.epoch}", lambda m: m.group_id)

    dlq = bus.read_raw(f"{unique}.dlq")
    # (a record after the learner's checkpoint positions is read again after its restart, and dead-lettered
    # again: exactly-once dead letters are checked by the run without kills below)
    origins = {r.headers["source_topic"].decode() for r in dlq}
    assert origins == {f"{unique}.rollouts", f"{unique}.scored"}
    _check_versions(bus, unique, before_kill, uploaded, steps, summary)
    kinds = {v.kind for k in open_store(f"s3://{unique}/job").list("policy/") if (v := parse_key(k))}
    assert kinds == {"snapshot", "delta"}, kinds  # the generators followed deltas through the kills
    bus.delete_topics([f"{unique}.{k}" for k in ("prompts", "rollouts", "scored", "policy", "metrics", "dlq")])
    bus.close()


def _check_grpc_is_mutual_tls(cluster: LocalCluster, role_id: str) -> None:
    """The launcher's roles serve gRPC under the run's CA: the user's `client` identity (<out>/tls/client)
    reads Status, a plain-text call never reaches the role, and the private keys are the owner's only."""
    import grpc

    from scalerl.rpc.client import GeneratorClient
    from scalerl.rpc.security import RpcSecurity

    ports = json.loads(next(line for line in cluster.procs[role_id].log_path.read_text().splitlines()
                            if line.startswith("{")))
    target = f"127.0.0.1:{ports['grpc']}"
    with GeneratorClient(target, security=RpcSecurity(str(cluster.out / "tls" / "client"))) as client:
        assert client.status()["policy_version"] >= 0
    with GeneratorClient(target, security=RpcSecurity.development(), timeout_s=5) as plain, \
            pytest.raises(grpc.RpcError) as err:
        plain.status()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert {oct(p.stat().st_mode & 0o777) for p in (cluster.out / "tls").glob("*/tls.key")} == {"0o600"}
    assert "PLAIN TEXT" not in cluster.procs[role_id].log_path.read_text()


def _check_side_port(cluster: LocalCluster, role_id: str, input_topic: str, timeout_s: float = 120,
                     broadcast: bool = False) -> None:
    """The role's side port: ready (it holds a policy), and /metrics counts its tokens (once it has had a
    partition: it may have joined the group after the other generator took both) and its input lag."""
    ports = json.loads(next(line for line in cluster.procs[role_id].log_path.read_text().splitlines()
                            if line.startswith("{")))
    # HTTPS with the role's certificate; /metrics needs the scrape token the launcher made
    tls_dir, token = cluster.out / "tls" / "generator", (cluster.out / "tls" / "metrics-token").read_text().strip()
    assert side_get(ports["http"], "/readyz", tls_dir)[0] == 200
    assert side_get(ports["http"], "/metrics", tls_dir)[0] == 401
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = side_get(ports["http"], "/metrics", tls_dir, token)
        assert status == 200
        text = body.decode()
        tokens = [float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith("scalerl_generator_tokens_total ")]
        assert tokens, "no scalerl_generator_tokens_total on /metrics"
        if tokens[0] > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert tokens[0] > 0, f"{role_id} generated no tokens within {timeout_s:.0f} s"
    assert f'scalerl_generator_queue_lag_messages{{topic="{input_topic}"}}' in text
    if broadcast:  # shards came by the learner's broadcast, not only by download
        pushed = [float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith("scalerl_generator_weights_broadcast_bytes_total ")]
        assert pushed and pushed[0] > 0, f"{role_id}: no shard bytes taken from the broadcast"


def _announced(bus: KafkaBus, unique: str) -> list[tuple[int, str, int]]:
    """(version, checksum, learner step) of every announcement on the policy topic, in order."""
    out = []
    for rec in bus.read_raw(f"{unique}.policy"):
        pv = decode_envelope(rec.value, PolicyVersion)
        out.append((pv.version, pv.checksum, int(rec.headers["learner_step"])))
    return out


def _check_versions(bus: KafkaBus, unique: str, before_kill: list[tuple[int, str, int]], uploaded: int | None,
                    steps: list[dict], summary: dict) -> None:
    """No version number announced with two different weights; the resumed learner's first announcement
    numbers past everything uploaded before the kill (`uploaded`: the store's highest version then, which
    covers every announced one: weights are uploaded before they are announced); staleness is never
    negative; every trained group with a token of the lost lineage was dropped (counted in
    dropped_lost_lineage)."""
    announced = _announced(bus, unique)
    checksums: dict[int, set[str]] = {}
    for version, checksum, _ in announced:
        checksums.setdefault(version, set()).add(checksum)
    assert all(len(c) == 1 for c in checksums.values()), {v: c for v, c in checksums.items() if len(c) > 1}
    assert uploaded is not None and uploaded >= max(v for v, _, _ in before_kill)
    resumed = announced[len(before_kill):]
    assert resumed and resumed[0][0] == uploaded + 1 and resumed[0][2] == 4  # step 4's weights, a new number
    lost = {v for v, _, step in before_kill if step > 4}
    assert lost, "the learner was killed after announcing versions past its checkpoint"
    assert all(r["staleness_mean"] is None or r["staleness_mean"] >= 0 for r in steps)
    assert all(r["staleness_max"] is None or r["staleness_max"] >= 0 for r in steps)
    # groups of the steps after the resume: the scored record of each (unique group ids only)
    versions: dict[str, list[set[int]]] = {}
    for rec in bus.read_raw(f"{unique}.scored"):
        if not rec.value.startswith(b"\x00"):
            g = decode_envelope(rec.value, ScoredGroup)
            versions.setdefault(g.group_id, []).append({v for c in g.rollout.completions for v in c.versions})
    for r in steps:
        ids = r["group_ids"] + r["dropped_group_ids"]
        if r["step"] <= 4 or any(len(versions.get(gid, [])) != 1 for gid in ids):
            continue
        expected = sum(1 for gid in ids if versions[gid][0] & lost)
        assert r["dropped_lost_lineage"] == expected, (r["step"], expected, r["dropped_lost_lineage"])
    assert summary["dropped_lost_lineage"] == sum(r["dropped_lost_lineage"] or 0 for r in steps if r["step"] > 4)


BAD_RUN = {"steps": 6, "off_policy": {"mode": "pipeline", "k": 2}, "checkpoint_every": 6, "eval_every": 6,
           "partitions": 1}


def _first_rollout(bus: KafkaBus, topic: str) -> RolloutGroup | None:
    """The first rollout group on `topic` (None: none yet, or the topic is not created yet)."""
    try:
        return next((decode_envelope(r.value, RolloutGroup) for r in bus.read_raw(topic, timeout_s=2.0)), None)
    except Exception:
        return None


def _bad_records(template: ScoredGroup, vocab: int) -> dict[str, tuple[str, object, str]]:
    """key -> (topic kind, well-typed record with a bad value, what its reason must contain). Each uses a
    known prompt id under its own epoch (900+), so its group id is unlike any the curriculum issues, and no
    issue number (a record that carries an issued group's number names that group: scalerl.bus.dedup)."""
    def scored(i: int) -> ScoredGroup:
        g = copy.deepcopy(template)
        g.rollout.task.epoch, g.rollout.task.seq = 900 + i, 0
        return g

    out: dict[str, tuple[str, object, str]] = {}
    g = scored(0)
    g.rollout.completions[0].token_ids[0] = vocab + 50_000
    out["bad-token-rollout"] = ("rollouts", g.rollout, "token_out_of_range: ")
    # (arrays of unequal length cannot be encoded at all: the codec refuses them, and a peer's such record
    # is undecodable, dead-lettered as such; the rule is unit-tested in tests/unit/core/test_validate.py)
    g = scored(2)
    g.rollout.completions[0].logprobs[0] = math.nan
    out["bad-nan-logprob-rollout"] = ("rollouts", g.rollout, "non_finite_logprob: ")
    g = scored(3)
    g.rollout.completions.pop()
    out["bad-group-size-rollout"] = ("rollouts", g.rollout, "group_size: ")
    g = scored(4)
    for c in g.rollout.completions:
        c.versions = [10_000] * len(c.token_ids)
    out["bad-future-version-scored"] = ("scored", g, "version_out_of_range: ")
    g = scored(5)
    g.rollout.completions[1].token_ids[-1] = vocab
    out["bad-token-scored"] = ("scored", g, "token_out_of_range: ")
    g = scored(6)
    g.rewards[0] = math.nan
    out["bad-nan-reward-scored"] = ("scored", g, "non_finite_reward: ")
    g = scored(7)
    g.rewards, g.correct = g.rewards[:-1], g.correct[:-1]
    g.rollout.completions.pop()
    out["bad-group-size-scored"] = ("scored", g, "group_size: ")
    out["garbage-scored"] = ("scored", b"\x00not an envelope", "undecodable: ")
    out["json-scored"] = ("scored", b'{"hello": "world"}', "undecodable: JSON object without the envelope")
    return out


@pytest.mark.timeout(900)
def test_bad_values_are_dead_lettered_once_and_the_run_finishes(infra, unique, sft_start, tmp_path,
                                                                addition_run_spec):
    spec = addition_run_spec(unique, sft_start, **BAD_RUN)
    out = tmp_path / "run"
    cluster = LocalCluster(spec, out, f"kafka://{infra.kafka_bootstrap}", f"s3://{unique}/job",
                           generators=1, verifiers=1, env=infra.s3_env())
    bus = KafkaBus(infra.kafka_bootstrap)
    try:
        # The verifier starts only after the bad records are in: every scored record the learner trains on
        # comes after the bad ones (one partition), and at most the in-flight cap (2B) of rollouts before them,
        # so the run cannot finish without reading past every bad record, however fast or loaded the machine.
        for role, role_id in (("learner", "learner-0"), ("curriculum", "curriculum-0"), ("generator", "generator-0")):
            cluster.start(role, role_id)
        rollout = wait_for("a first rollout group", lambda: _first_rollout(bus, f"{unique}.rollouts"), timeout_s=480)
        n = len(rollout.completions)
        bad = _bad_records(ScoredGroup(rollout, [1.0] * n, [True] * n), model_vocab_size(spec.model))
        for key, (kind, value, _) in bad.items():
            if isinstance(value, bytes):
                bus.publish_raw(f"{unique}.{kind}", value, key=key.encode())
            else:
                bus.publish(f"{unique}.{kind}", value, key=key)
        bus.flush()
        cluster.start("verifier", "verifier-0")
        assert cluster.wait_learner(timeout_s=480) == 0, cluster.tail("learner-0")
        codes = cluster.stop_all()
    finally:
        cluster.stop_all(timeout_s=30)
    assert set(codes.values()) == {0}, codes
    steps = steps_of(out)
    assert [r["step"] for r in steps] == list(range(1, BAD_RUN["steps"] + 1))

    # each bad record once in the dead-letter topic, parked by its topic's owner, with its reason
    dead = [r for r in bus.read_raw(f"{unique}.dlq") if r.key is not None and r.key.decode() in bad]
    assert sorted(r.key.decode() for r in dead) == sorted(bad)
    owners = {"rollouts": f"{unique}.verifiers", "scored": f"{unique}.learner"}
    for r in dead:
        kind, _, reason = bad[r.key.decode()]
        assert r.headers["source_topic"].decode() == f"{unique}.{kind}"
        assert r.headers["role"].decode() == owners[kind]
        assert reason in r.headers["reason"].decode(), (r.key, r.headers["reason"])

    # accounting: issued = trained (incl. dropped) + dead-lettered + in flight; no bad group was trained
    summary = json.loads((out / "summary.json").read_text())
    issued = {f"{t.prompt_id}@{t.epoch}" for t in (decode_envelope(r.value) for r in bus.read_raw(f"{unique}.prompts"))}
    trained = [gid for r in steps for gid in r["group_ids"]]
    assert len(trained) == len(set(trained)) == BAD_RUN["steps"] * spec.train.prompts_per_step
    assert set(trained) <= issued, "a group the curriculum never issued was trained"
    in_flight = issued - set(trained)
    assert len(issued) == len(trained) + len(in_flight)  # no real group was dead-lettered
    semantic_scored = sum(1 for kind, value, _ in bad.values() if kind == "scored" and not isinstance(value, bytes))
    assert summary["dead_lettered"] == semantic_scored
    bus.delete_topics([f"{unique}.{k}" for k in ("prompts", "rollouts", "scored", "policy", "metrics", "dlq")])
    bus.close()
