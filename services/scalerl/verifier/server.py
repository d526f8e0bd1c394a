"""The verifier's gRPC service (`scalerl.v1.Verifier`): Score one rollout group, Status.

Score answers the rewards and correctness flags of `Verifier.score` in the rollout's order (the
client re-attaches them to its rollout: the group is not sent back). A rollout that breaks the
message rules (scalerl.messages.validate) -> INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from scalerl.messages import MessageError, RolloutGroup
from scalerl.rpc.convert import from_proto
from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.gen.scalerl.v1 import services_pb2_grpc as sgrpc
from scalerl.rpc.server import abort, status_reply
from scalerl.telemetry.metrics import RoleMetrics
from scalerl.verifier.verifier import Verifier


class VerifierServicer(sgrpc.VerifierServicer):  # type: ignore[misc]
    service_name = "scalerl.v1.Verifier"

    def __init__(self, verifier: Verifier, *, verifier_id: str = "verifier-0", metrics: RoleMetrics | None = None,
                 ready: Callable[[], bool] | None = None,
                 status_fn: Callable[[], Mapping[str, Any]] | None = None) -> None:
        """status_fn: extra VerifierStatus fields (e.g. the bus role's counters, which replace these)."""
        self.verifier = verifier
        self.verifier_id = verifier_id
        self.metrics = metrics
        self.ready = ready or (lambda: True)
        self.status_fn = status_fn
        self._lock = threading.Lock()
        self.groups_scored = self.completions_scored = self.completions_correct = 0

    def register(self, server: grpc.Server) -> None:
        sgrpc.add_VerifierServicer_to_server(self, server)

    def Score(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        if not request.HasField("rollout"):
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, "rollout: missing")
        try:
            rollout: RolloutGroup = from_proto(request.rollout)
        except MessageError as exc:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"rollout: {exc}")
        t0 = time.perf_counter()
        scored = self.verifier.score(rollout)
        if self.metrics is not None:
            self.metrics.step_seconds.observe(time.perf_counter() - t0)
        with self._lock:
            self.groups_scored += 1
            self.completions_scored += len(scored.correct)
            self.completions_correct += sum(scored.correct)
        return spb.ScoreResponse(rewards=scored.rewards, correct=scored.correct)

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        with self._lock:
            msg = spb.VerifierStatus(role="verifier", id=self.verifier_id, ready=bool(self.ready()),
                                     groups_scored=self.groups_scored, completions_scored=self.completions_scored,
                                     completions_correct=self.completions_correct)
        return status_reply(msg, self.status_fn, context)
