"""Prometheus metrics of one role, on a CollectorRegistry of its own (several roles can share a
process, e.g. in tests or `scalerl run --distributed`, without clashing on the global registry).

Names are `scalerl_<role>_<what>_<unit>` (Prometheus conventions: counters end in `_total`, times in
`_seconds`):

attribute -> metric (type): meaning
- tokens -> scalerl_<role>_tokens_total (counter): tokens generated (generator) or trained (learner);
  tokens/s is `rate()` of it.
- groups_in / groups_out -> scalerl_<role>_groups_in_total / _groups_out_total (counters): records
  consumed (prompt tasks, rollout or scored groups) / produced.
- queue_lag -> scalerl_<role>_queue_lag_messages{topic} (gauge): records of an input topic not yet
  committed by the role's consumer group.
- staleness -> scalerl_<role>_policy_staleness_versions (gauge): the newest announced policy version
  minus the oldest that produced a token of the last batch published (generator: > 0 when weights
  changed in flight), or the oldest of the data trained on in the last step (learner).
- policy_version -> scalerl_<role>_policy_version (gauge): loaded (generator) or published (learner).
- step_seconds -> scalerl_<role>_step_seconds (histogram): one unit of work: a generation batch, a
  scoring batch, an optimizer step.
- ready -> scalerl_<role>_ready (gauge): 1 while /readyz answers 200, else 0.
- progress (learner only) -> scalerl_learner_<LEARNER_PROGRESS name> (gauges): the last evaluation, the
  online fit, compute and the bound k. A value the learner does not have yet (no evaluation, no fit the
  data can support) has no sample at all: the family is exposed (HELP/TYPE) without one, so a dashboard
  shows no line rather than a 0 that reads like a measurement.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

ROLES = ("generator", "verifier", "learner", "curriculum")
# From a 5 ms scoring batch to a 10 min optimizer step of a large model.
STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


# status() key -> (learner gauge name, help): what the dashboards' pass-rate and forecast panels read.
LEARNER_PROGRESS = (
    ("eval_pass_rate", "eval_pass_rate", "Held-out mean@k of the last evaluation (fraction)."),
    ("compute_device_hours", "compute_device_hours", "Training compute so far (device-hours)."),
    ("compute_flops", "compute_flops", "Training compute so far, machine-independent (FLOPs)."),
    ("devices", "devices", "Devices the job holds now, integrated into compute_device_hours (devices)."),
    ("fit_A", "fit_a", "Fitted asymptotic pass rate A of the online sigmoid fit."),
    ("fit_A_low", "fit_a_low", "Lower end of A's bootstrap interval."),
    ("fit_A_high", "fit_a_high", "Upper end of A's bootstrap interval."),
    ("fit_B", "fit_b", "Fitted scaling exponent B."),
    ("fit_C_mid", "fit_c_mid_device_hours", "Fitted compute at half the gain, C_mid (device-hours)."),
    ("fit_R0", "fit_r0", "Pass rate at zero compute used by the fit, R0."),
    ("forecast_budget_identified", "forecast_budget_identified",
     "1 when the forecast of the last eval of the budget (train.steps) is identified, 0 when not yet."),
    ("forecast_budget_pass_rate", "forecast_budget_pass_rate",
     "Forecast held-out pass rate at the end of the budget (fraction); absent while not identified."),
    ("forecast_budget_low", "forecast_budget_low",
     "Low end of that forecast's prediction interval at the fit's level (fraction)."),
    ("forecast_budget_high", "forecast_budget_high",
     "High end of that forecast's prediction interval at the fit's level (fraction)."),
    ("staleness_bound", "staleness_bound_versions", "The recipe's off-policy bound k (versions)."),
)


class ProgressGauges:
    """The learner's progress gauges (LEARNER_PROGRESS): a sample only for the values set by `update`."""

    def __init__(self, prefix: str, registry: CollectorRegistry) -> None:
        self._families = [(key, f"{prefix}_{name}", doc) for key, name, doc in LEARNER_PROGRESS]
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def update(self, values: Mapping[str, float]) -> None:
        """Replace the values: a key missing from `values` has no sample from now on."""
        with self._lock:
            self._values = {key: float(values[key]) for key, _, _ in self._families if key in values}

    def values(self) -> dict[str, float]:
        with self._lock:
            return dict(self._values)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values = self.values()
        for key, name, doc in self._families:
            family = GaugeMetricFamily(name, doc)
            if key in values:
                family.add_metric([], values[key])
            yield family


class RoleMetrics:
    """The metrics of one role (see the module docstring), registered on `registry` (default: a new one)."""

    def __init__(self, role: str, registry: CollectorRegistry | None = None) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        self.role = role
        self.registry = registry if registry is not None else CollectorRegistry()
        p, r = f"scalerl_{role}", self.registry
        self.tokens = Counter(f"{p}_tokens", "Tokens generated (generator) or trained (learner); "
                              "rate() gives tokens/s.", registry=r)
        self.groups_in = Counter(f"{p}_groups_in", "Records consumed (prompt tasks, rollout or scored "
                                 "groups).", registry=r)
        self.groups_out = Counter(f"{p}_groups_out", "Records produced (rollout or scored groups, "
                                  "prompt tasks, policy versions).", registry=r)
        self.queue_lag = Gauge(f"{p}_queue_lag_messages", "Records of an input topic not yet committed "
                               "by this role's consumer group.", ["topic"], registry=r)
        self.staleness = Gauge(f"{p}_policy_staleness_versions", "Newest announced policy version minus "
                               "the oldest that produced the last batch published (generator) or the "
                               "oldest of the data trained on in the last step (learner).", registry=r)
        self.policy_version = Gauge(f"{p}_policy_version", "Policy version loaded (generator) or "
                                    "published (learner).", registry=r)
        self.step_seconds = Histogram(f"{p}_step_seconds", "Duration of one unit of work: a generation "
                                      "batch, a scoring batch, an optimizer step.", buckets=STEP_BUCKETS_S,
                                      registry=r)
        self.dead_lettered = Counter(f"{p}_dead_lettered", "Records this role sent to the dead-letter "
                                     "topic (or skipped as another role's to dead-letter), by reason code "
                                     "(scalerl.bus.validate.REASON_CODES).", ["reason"], registry=r)
        self.ready = Gauge(f"{p}_ready", "1 while the role is ready (/readyz answers 200), else 0.",
                           registry=r)
        if role == "generator":  # weight sync (scalerl.weightsync): what building each announced version cost
            self.weights_bytes = Counter(f"{p}_weights_bytes", "Bytes of weight shards downloaded (snapshots "
                                         "and deltas); rate() gives bytes/s.", registry=r)
            self.weights_unbuildable = Counter(f"{p}_weights_unbuildable", "Announced versions that could not "
                                               "be built from the store (a snapshot was asked for; the loaded "
                                               "weights were kept).", registry=r)
            self.weights_build_seconds = Gauge(f"{p}_weights_build_seconds", "Seconds the last announced "
                                               "version took to build in the background (download, decode, "
                                               "checksums), before its swap.", registry=r)
            self.weights_broadcast_bytes = Counter(f"{p}_weights_broadcast_bytes", "Bytes of weight shards taken "
                                                   "from the learner's broadcast instead of downloaded "
                                                   "(runtime.weight_sync.broadcast).", registry=r)
            self.broadcast_failures = Counter(f"{p}_broadcast_failures", "Times this generator lost its broadcast "
                                              "group (a timeout, a peer or the learner gone) and joined again; "
                                              "what it missed came from the store.", registry=r)
            self.broadcast_in_group = Gauge(f"{p}_broadcast_in_group", "1 while this generator is a member of "
                                            "the learner's broadcast group, else 0.", registry=r)
        if role == "verifier":  # what grading found and cost (Task.grade)
            self.verdicts = Counter(f"{p}_verdicts", "Completions graded, by verdict (correct, wrong, no_answer, "
                                    "truncated; code tasks: pass, fail, error, timeout, memory, forbidden, ...).",
                                    ["verdict"], registry=r)
            self.grading_seconds = Counter(f"{p}_grading_seconds", "Seconds spent grading (code tasks: the "
                                           "sandboxed executions' wall time); rate() gives busy seconds/s.",
                                           registry=r)
            self.tests_passed = Counter(f"{p}_tests_passed", "Code tasks: the fraction of a completion's asserts "
                                        "that passed, summed over completions (divide by the verdicts' total for "
                                        "the mean).", registry=r)
        if role == "learner":  # the broadcast path (runtime.weight_sync.broadcast)
            self.broadcast_sent = Counter(f"{p}_broadcast_versions", "Policy versions every member of the "
                                          "broadcast group received.", registry=r)
            self.broadcast_skipped = Counter(f"{p}_broadcast_skipped", "Policy versions sent through the store "
                                             "only, no broadcast group being formed.", registry=r)
            self.broadcast_stuck = Counter(f"{p}_broadcast_stuck", "Transfers a generator held up past "
                                           "runtime.weight_sync.broadcast.timeout_s, by generator id (the group "
                                           "was rebuilt; the version went through the store).", ["generator"],
                                           registry=r)
            self.broadcast_members = Gauge(f"{p}_broadcast_members", "Generators in the learner's broadcast "
                                           "group.", registry=r)
        # the learner's progress and its online sigmoid fit (dashboards, operator status)
        self.progress = ProgressGauges(p, r) if role == "learner" else None

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format."""
        return bytes(generate_latest(self.registry))
