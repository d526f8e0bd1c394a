"""The chaos run (#27): a distributed run over the real Kafka broker and MinIO under a seeded plan of faults of
every kind (`scalerl.faults.plan.chaos_plan`: the learner SIGKILLed before its first periodic checkpoint,
mid-step, mid-upload and mid-announcement; a generator, a verifier and the curriculum killed mid-batch; sends,
flushes and dead-letter sends that fail; membership dropped; the policy reader delayed), every crashed role
restarted, and poison records that must be dead-lettered. The run must finish, and the accounting identity
(`scalerl.chaos.accounting`), read from the bus and the store, must hold: every issued group decided in
exactly one step, dead-lettered once, or still in flight; no step number repeated; nothing committed without
its output.
"""

from __future__ import annotations

import json

import pytest

from scalerl.chaos.run import run_chaos
from scalerl.faults.plan import CRASH_POINTS, KINDS, chaos_plan

pytestmark = [pytest.mark.infra, pytest.mark.distributed]

STEPS, CHECKPOINT_EVERY = 8, 4
RUN = {"steps": STEPS, "off_policy": {"mode": "pipeline", "k": 2}, "checkpoint_every": CHECKPOINT_EVERY,
       "eval_every": STEPS, "partitions": 2}


@pytest.mark.timeout(1200)
def test_chaos_run_keeps_the_accounting_identity(infra, s3_env, unique, tmp_path, addition_run_spec, mixed_start):
    spec = addition_run_spec(unique, mixed_start, **RUN)
    plan = chaos_plan(7, n_faults=12, steps=STEPS, checkpoint_every=CHECKPOINT_EVERY)
    assert len(plan.faults) >= 10 and set(plan.kinds()) == set(KINDS)

    result = run_chaos(spec, tmp_path / "run", plan, bootstrap=infra.kafka_bootstrap,
                       store_url=f"s3://{unique}/job", env=infra.s3_env(), timeout_s=1000)
    logs = "\n".join(f"{p.name}: {p.read_text()[-1500:]}" for p in sorted((tmp_path / "run" / "logs").glob("*.log")))
    assert result.finished, f"{result.error}; exit {result.learner_exit}\n{logs}"
    fired = {str(f["kind"]) for f in result.fired}
    assert set(CRASH_POINTS) <= fired, f"crash points that never fired: {set(CRASH_POINTS) - fired}"
    assert len(result.fired) >= 10, json.dumps(result.fired, indent=1)

    report = result.report
    assert report is not None, result.error
    assert report.ok, report.describe()
    assert report.steps == STEPS
    assert report.decided_in_steps >= STEPS * spec.train.prompts_per_step
    assert report.dead_lettered >= 1  # the too-long prompt the run was given
