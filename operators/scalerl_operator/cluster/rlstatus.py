"""The RL part of an RLJob's status, read from the job's Kafka `metrics` topic.

Source choice: the learner already publishes a `MetricRecord` per step on `<job>.metrics`
(runtime/learner_service.py `_announce`), the operator already talks to Kafka (topics, lag), and the
topic outlives both the learner and the operator: a restarted operator re-reads the tail and has the
status back at once. An HTTP status URL would need a network path from the operator to the learner
pod (absent in tests, where no pod runs, and often closed by network policies) and would go dark
while the learner restarts. The cost is freshness: one record per learner step.

Records read (`MetricRecord(kind, step, values)`; unknown kinds and keys are ignored):
- `train`: step = learner step = the policy version it just published; values `staleness_max`
  (policy versions, the staleness compared to the bound k), `batch_wait_frac` (fraction of the step
  wall time the learner waited for a batch: the generators' starvation signal);
- `eval`: `pass_rate` (held-out mean@k); `done`: the run finished (`final_pass_rate`; `run_files`: how
  many run files it uploaded to `<store>/run/` before, `report_html`: 1 when report.html is one of them,
  scalerl.store.run_files; `stop_reason` (`STOP_REASON_CODES`) and `stop_*` when spec.stopPolicy ended
  it, the numbers it acted on);
- `environment` (from each verifier that serves tool calls, `source` its id, every few seconds): `busy_fraction`
  (mean fraction of its execution slots in use over its last window) and `time_s` (when it was read): the
  verifier pool's second autoscaling input (scalerl_operator.autoscale.autoscaler.environment_proposal);
- `checkpoint`: step of a checkpoint uploaded to `<store>/checkpoints/step_<step:06d>`;
- `fit`: `A`, `B`, `C_mid`, `compute` (device-hours) and `A_low`/`A_high` (A's bootstrap interval) of the
  run's fit, as the learner computed it once (the numbers of its summary.json and report), and the
  forecast at the end of the budget: `budget_compute`, `budget_identified` (1/0), `budget_low`/`budget_high`
  (prediction interval), `budget_pass_rate` (identified only).
`fold` is pure; `MetricsTail` does the reading.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from scalerl.bus.security import KafkaSecurity
from scalerl.messages import STOP_REASON_CODES, MetricRecord
from scalerl.rpc.convert import decode_envelope

log = logging.getLogger(__name__)

TAIL_RECORDS = 500  # per partition, read on the first poll of a job (the status needs only the latest)


@dataclass(frozen=True, slots=True)
class LearnerStatus:
    """What the operator knows of the learner (None: not reported yet)."""

    step: int | None = None
    starvation: float | None = None
    staleness: float | None = None
    pass_rate: float | None = None
    checkpoint_step: int | None = None
    fit: dict[str, float] | None = None  # status.fit: A, B, Cmid, computeAtFit (device-hours), ALow, AHigh
    done: bool = False
    run_files: int = 0  # files the finished learner uploaded to <store>/run/ (status.report)
    report_html: bool = False  # report.html among them
    records: int = 0  # how many records were folded in (0: nothing heard from the learner)
    stopped_early: dict[str, Any] | None = None  # status.stoppedEarly: spec.stopPolicy ended the run
    # the verifiers serving tool calls: source id -> (busy fraction 0-1, Unix time of the reading); not learner
    # records (they leave `records` alone)
    environment: dict[str, tuple[float, float]] = field(default_factory=dict)


def fold(prev: LearnerStatus, records: list[MetricRecord]) -> LearnerStatus:
    """Apply records, oldest first, to the previous status."""
    s = prev
    for r in records:
        v = r.values
        if r.kind == "environment" and r.source and {"busy_fraction", "time_s"} <= v.keys():
            s = replace(s, environment={**s.environment, r.source: (v["busy_fraction"], v["time_s"])})
            continue
        if r.kind == "train":
            s = replace(s, step=r.step, staleness=v.get("staleness_max", s.staleness),
                        starvation=v.get("batch_wait_frac", s.starvation))
        elif r.kind == "eval" and "pass_rate" in v:
            s = replace(s, pass_rate=v["pass_rate"])
        elif r.kind == "checkpoint":
            s = replace(s, checkpoint_step=r.step)
        elif r.kind == "fit" and {"A", "B", "C_mid"} <= v.keys():
            fit = {"A": v["A"], "B": v["B"], "Cmid": v["C_mid"], "computeAtFit": v.get("compute", 0.0)}
            fit.update({k: v[src] for k, src in (("ALow", "A_low"), ("AHigh", "A_high")) if src in v})
            fit.update({_camel(k): v[k] for k in _BUDGET if k in v})
            if "budgetIdentified" in fit:
                fit["budgetIdentified"] = bool(fit["budgetIdentified"])
            s = replace(s, fit=fit)
        elif r.kind == "done":
            s = replace(s, done=True, pass_rate=v.get("final_pass_rate", s.pass_rate), step=r.step,
                        run_files=int(v.get("run_files", 0)), report_html=bool(v.get("report_html", 0.0)),
                        stopped_early=stopped_early(v))
        else:
            continue
        s = replace(s, records=s.records + 1)
    return s


def to_status(s: LearnerStatus, *, store_uri: str, bound_k: int) -> dict[str, Any]:
    """The RLJob status fields (camelCase) this learner status fills; None clears a field."""
    return {
        "policyVersion": s.step, "learnerStep": s.step,
        "lastCheckpoint": None if s.checkpoint_step is None else {
            "uri": f"{store_uri.rstrip('/')}/checkpoints/step_{s.checkpoint_step:06d}", "step": s.checkpoint_step},
        "staleness": None if s.staleness is None else {"current": round(s.staleness), "bound": bound_k,
                                                       "summary": f"{round(s.staleness)}/{bound_k}"},
        "passRate": None if s.pass_rate is None else min(1.0, max(0.0, s.pass_rate)),
        "fit": None if s.fit is None else dict(s.fit),
        "stoppedEarly": s.stopped_early,
        "report": report_status(s, store_uri),
    }


_BUDGET = ("budget_compute", "budget_identified", "budget_pass_rate", "budget_low", "budget_high")


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w.upper() if w == "a" else w.capitalize() for w in rest)


def stopped_early(values: dict[str, float]) -> dict[str, Any] | None:
    """status.stoppedEarly of a `done` record: the reason's name and the numbers the learner acted on; None
    when the run ran its steps (or the record lacks them: an older learner)."""
    names = {code: name for name, code in STOP_REASON_CODES.items()}
    keys = ("step", "compute", "budget_compute", "gain_high", "A_high", "level")
    if values.get("stop_reason") not in names or any(f"stop_{k}" not in values for k in keys):
        return None
    out: dict[str, Any] = {"reason": names[values["stop_reason"]], "step": int(values["stop_step"])}
    out.update({_camel(k): values[f"stop_{k}"] for k in keys[1:]})
    return out


def report_status(s: LearnerStatus, store_uri: str) -> dict[str, Any] | None:
    """status.report: where the finished run's files are (`scalerl fetch-run <uri> --out DIR` copies them);
    None until the learner reported them uploaded."""
    if not (s.done and s.run_files):
        return None
    run = f"{store_uri.rstrip('/')}/run"
    return {"uri": run, "summary": f"{run}/summary.json", "html": f"{run}/report.html" if s.report_html else None,
            "fetch": f"scalerl fetch-run {run} --out <folder>"}


class MetricsTail:
    """Reads what is new on one job's metrics topic (no consumer group: nothing is committed).

    The first `poll` starts `TAIL_RECORDS` before the end of each partition; later polls continue
    where the previous one stopped. Records that do not decode to a MetricRecord are skipped."""

    def __init__(self, bootstrap: str, topic: str, *, timeout_s: float = 10.0,
                 security: KafkaSecurity | None = None) -> None:
        from kafka import KafkaConsumer

        self.topic = topic
        self.timeout_s = timeout_s
        self.security = security or KafkaSecurity()
        self._c = KafkaConsumer(bootstrap_servers=[b.strip() for b in bootstrap.split(",") if b.strip()],
                                **self.security.client_kwargs(), group_id=None, enable_auto_commit=False,
                                client_id="scalerl-operator-metrics",
                                request_timeout_ms=int(timeout_s * 1000) + 1000,
                                bootstrap_timeout_ms=int(timeout_s * 1000),
                                consumer_timeout_ms=int(timeout_s * 1000))
        self._parts: list[Any] = []  # kafka TopicPartition

    def _assign(self) -> bool:
        from kafka import TopicPartition

        ids = self._c.partitions_for_topic(self.topic)
        if not ids:
            return False
        parts = [TopicPartition(self.topic, p) for p in sorted(ids)]
        if parts != self._parts:
            new = [tp for tp in parts if tp not in self._parts]
            self._c.assign(parts)
            begin, end = self._c.beginning_offsets(new), self._c.end_offsets(new)
            for tp in new:
                self._c.seek(tp, max(begin[tp], end[tp] - TAIL_RECORDS))
            self._parts = parts
        return True

    def poll(self) -> list[MetricRecord]:
        """Every MetricRecord appended since the last poll (up to the end offsets taken now)."""
        if not self._assign():
            return []
        end = self._c.end_offsets(self._parts)
        out: list[tuple[int, int, MetricRecord]] = []
        deadline = time.monotonic() + self.timeout_s
        while any(self._c.position(tp) < end[tp] for tp in self._parts) and time.monotonic() < deadline:
            for tp, recs in self._c.poll(timeout_ms=200).items():
                for r in recs:
                    try:
                        msg = decode_envelope(r.value)
                    except Exception as exc:  # a bad record never stops the status
                        log.debug("%s@%d: not a message: %s", tp, r.offset, exc)
                        continue
                    if isinstance(msg, MetricRecord):
                        out.append((r.timestamp, r.offset, msg))
        return [m for _, _, m in sorted(out, key=lambda x: (x[0], x[1]))]

    def close(self) -> None:
        self._c.close(autocommit=False)
