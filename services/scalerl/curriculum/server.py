"""The curriculum's gRPC service (`scalerl.v1.Curriculum`): Status, filled from a callable of the
curriculum loop.

`status_fn()` returns a dict of CurriculumStatus fields (epoch, prompts_issued, prompts_inflight,
prompts_retired, groups_scored, policy_version, ready, ...); a key that is not a field, or a value of
the wrong type, answers INTERNAL with the field name and the allowed ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc

from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.gen.scalerl.v1 import services_pb2_grpc as sgrpc
from scalerl.rpc.server import status_reply


class CurriculumServicer(sgrpc.CurriculumServicer):  # type: ignore[misc]
    service_name = "scalerl.v1.Curriculum"

    def __init__(self, status_fn: Callable[[], Mapping[str, Any]], *, curriculum_id: str = "curriculum-0",
                 ready: Callable[[], bool] | None = None) -> None:
        self.status_fn = status_fn
        self.curriculum_id = curriculum_id
        self.ready = ready or (lambda: True)

    def register(self, server: grpc.Server) -> None:
        sgrpc.add_CurriculumServicer_to_server(self, server)

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        msg = spb.CurriculumStatus(role="curriculum", id=self.curriculum_id, ready=bool(self.ready()))
        return status_reply(msg, self.status_fn, context)
