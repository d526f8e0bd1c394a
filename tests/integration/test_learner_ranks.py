"""The learner as two torchrun ranks (FSDP over gloo) in a distributed run on the real Kafka and MinIO.

Rank 0 serves and reads `scored`; rank 1 only follows its collectives. The learner group is killed
(SIGKILL to torchrun and both ranks) after its first checkpoint (step n) and started again. Then the
published weights are checked against a single-process learner replaying the same groups: step 1 from
the initial policy, and step n + 1 from the step-n checkpoint, which proves the gathered optimizer state (and the LR
schedule) went through the checkpoint and back into two shards intact.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch

from distributed_checks import steps_of
from scalerl.bus.kafka import KafkaBus
from scalerl.learner.checkpoint import load_trainer_state
from scalerl.learner.learner import Learner
from scalerl.messages import PolicyVersion, ScoredGroup
from scalerl.model.factory import load_model_and_tokenizer
from scalerl.rpc.convert import decode_envelope
from scalerl.runtime.launcher import LocalCluster
from scalerl.store import open_store
from scalerl.store.checkpoints import latest_checkpoint_name
from scalerl.weightsync.reader import load_weights

pytestmark = [pytest.mark.infra, pytest.mark.distributed]

STEPS = 8
RUN = {"steps": STEPS, "off_policy": {"mode": "pipeline", "k": 2}, "checkpoint_every": 2, "eval_every": 4,
       "partitions": 2}


def _first_checkpoint(store, cluster: LocalCluster, timeout_s: float = 300) -> str:
    """The name of the first checkpoint the learner publishes (polled fast: steps take a fraction of a second)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        name = latest_checkpoint_name(store)
        if name is not None:
            return name
        learner = cluster.procs["learner-0"].popen
        assert learner.poll() is None, f"learner exited early ({learner.returncode}):\n{cluster.tail('learner-0')}"
        time.sleep(0.02)
    pytest.fail(f"no checkpoint within {timeout_s:.0f} s:\n{cluster.tail('learner-0')}")


def _download(store, name: str, dest: Path) -> Path:
    for key in store.list(f"checkpoints/{name}/"):
        path = dest / key.removeprefix("checkpoints/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get_bytes(key))
    return dest / name


def _replay(spec, folder: str | Path, groups_per_step: list[list[ScoredGroup]],
            learner_state: dict | None) -> dict[str, torch.Tensor]:
    """A single-process learner from `folder`'s weights (and `learner_state`), stepped on each batch."""
    model, tok = load_model_and_tokenizer(spec.model, spec.seed, folder)
    learner = Learner(spec, model, pad_id=tok.pad_token_id)
    if learner_state is not None:
        learner.load_state_dict(learner_state)
    for groups in groups_per_step:
        learner.step(groups)
    return learner.full_state_dict()


@pytest.mark.timeout(900)
def test_two_rank_learner_matches_one_process_and_resumes(infra, unique, tmp_path, addition_run_spec,
                                                          mixed_start):
    spec = addition_run_spec(unique, mixed_start, **RUN)  # mixed groups
    out = tmp_path / "run"
    store_url = f"s3://{unique}/job"
    cluster = LocalCluster(spec, out, f"kafka://{infra.kafka_bootstrap}", store_url, generators=1, verifiers=1,
                           learner_ranks=2, env=infra.s3_env())
    bus = KafkaBus(infra.kafka_bootstrap, client_id=f"{unique}-test")
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in infra.s3_env().items():
                mp.setenv(k, v)
            store = open_store(store_url)
            cluster.start_all()
            _first_checkpoint(store, cluster)
            cluster.kill("learner-0", signal.SIGKILL)  # torchrun and both ranks, mid-run
            resumed = latest_checkpoint_name(store)  # (one more may have landed before the kill)
            n = int(resumed.removeprefix("step_"))
            assert n < STEPS, "the learner finished before it was killed"
            ckpt = _download(store, resumed, tmp_path / "ckpt")  # (pruned from the store later on)
            cluster.start("learner", "learner-0")
            assert cluster.wait_learner(timeout_s=600) == 0, cluster.tail("learner-0", 60)
            log = cluster.procs["learner-0"].log_path.read_text()
            assert "learner rank 1 of 2 joined (gloo)" in log
            assert f"learner resumed from {resumed}" in log
            assert f"learner rank 1: done after {STEPS - n} steps" in log  # only the steps after the restart

            # started again after the end (as a StatefulSet restarts a container that exited): nothing redone
            evals = (out / "metrics.jsonl").read_text()
            cluster.start("learner", "learner-0")
            assert cluster.wait_learner(timeout_s=300) == 0, cluster.tail("learner-0", 60)
            assert f"already finished at step {STEPS}" in cluster.procs["learner-0"].log_path.read_text()
            assert (out / "metrics.jsonl").read_text() == evals

            steps = steps_of(out)
            assert sorted(r["step"] for r in steps) == list(range(1, STEPS + 1))
            by_id = {}
            for rec in bus.read_raw(f"{unique}.scored"):
                g = decode_envelope(rec.value, ScoredGroup)
                by_id.setdefault(g.group_id, g)  # a copy (a role produced it again) is skipped: the first is trained
            policies: dict[int, PolicyVersion] = {}
            for rec in bus.read_raw(f"{unique}.policy"):
                pv = decode_envelope(rec.value, PolicyVersion)
                policies[pv.version] = pv  # the last announcement: a killed learner's later steps were redone
            batches = {r["step"]: [by_id[i] for i in r["group_ids"]] for r in steps}

            # steps 1..n from the initial policy, in one process = the weights in the step-n checkpoint
            first = _replay(spec, spec.model.init_checkpoint, [batches[i] for i in range(1, n + 1)], None)
            model, _ = load_model_and_tokenizer(spec.model, spec.seed, ckpt)
            _assert_same(first, {k: v.detach() for k, v in model.state_dict().items()})
            # steps n+1..end from that checkpoint (weights, full optimizer state, schedule) = the final policy
            state = load_trainer_state(ckpt)["learner"]
            assert state["version"] == n and state["optimizer"]["state"]
            rest = _replay(spec, ckpt, [batches[i] for i in range(n + 1, STEPS + 1)], state)
            _assert_same(rest, load_weights(store, policies[STEPS]))
    finally:
        cluster.stop_all()
        bus.delete_topics([f"{unique}.{k}" for k in ("prompts", "rollouts", "scored", "policy", "metrics", "dlq")])
        bus.close()


def _assert_same(single: dict[str, torch.Tensor], published: dict[str, torch.Tensor]) -> None:
    assert set(single) == set(published)
    for name, ref in single.items():
        torch.testing.assert_close(published[name].float(), ref.float(), rtol=1e-4, atol=1e-6, msg=name)
