"""The learner's gRPC service (`scalerl.v1.Learner`): Status, filled from a callable of the learner loop.

`status_fn()` returns a dict of LearnerStatus fields (step, groups_consumed, groups_dropped_stale,
staleness_versions, tokens_trained, step_seconds, policy_version, ready, ...); a key that is not a
field, or a value of the wrong type, answers INTERNAL with the field name and the allowed ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc

from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.gen.scalerl.v1 import services_pb2_grpc as sgrpc
from scalerl.rpc.server import status_reply


class LearnerServicer(sgrpc.LearnerServicer):  # type: ignore[misc]
    service_name = "scalerl.v1.Learner"

    def __init__(self, status_fn: Callable[[], Mapping[str, Any]], *, learner_id: str = "learner-0",
                 ready: Callable[[], bool] | None = None) -> None:
        self.status_fn = status_fn
        self.learner_id = learner_id
        self.ready = ready or (lambda: True)

    def register(self, server: grpc.Server) -> None:
        sgrpc.add_LearnerServicer_to_server(self, server)

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        msg = spb.LearnerStatus(role="learner", id=self.learner_id, ready=bool(self.ready()))
        return status_reply(msg, self.status_fn, context)
