"""Small clients of the role services, speaking scalerl.messages dataclasses.

    with GeneratorClient("127.0.0.1:50051", security=RpcSecurity.from_env()) as gen:
        completions = gen.generate(["12+34="], n=4, temperature=1.0)   # prompt-major: 4 for prompt 0
    with VerifierClient(target, security=security) as ver:
        scored = ver.score(rollout)                                      # == Verifier.score(rollout)

Every call goes through the tracing interceptor (a CLIENT span whose `traceparent` travels in the
metadata) and has a deadline (`timeout_s`). `security` presents this process's certificate and
checks the server's (`scalerl.rpc.security`), or is plain text for local development. A failed call
raises `grpc.RpcError` (`.code()`, `.details()`), e.g. INVALID_ARGUMENT naming the bad field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

from scalerl.messages import Completion, PolicyVersion, RolloutGroup, ScoredGroup
from scalerl.rpc.convert import from_proto, status_dict, to_proto
from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.gen.scalerl.v1 import services_pb2_grpc as sgrpc
from scalerl.rpc.security import RpcSecurity
from scalerl.rpc.server import DEFAULT_MAX_MESSAGE_BYTES, grpc_options
from scalerl.telemetry.tracing import ClientTracingInterceptor


@dataclass(frozen=True, slots=True)
class Generated:
    """A Generate answer: per prompt, the ids it was conditioned on and its n completions."""

    prompt_token_ids: list[list[int]]
    completions: list[list[Completion]]
    policy_version: int


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    previous_version: int
    policy_version: int
    swapped: bool
    load_seconds: float


class _Client:
    _stub: Any  # the service's generated stub class

    def __init__(self, target: str, *, security: RpcSecurity, timeout_s: float = 120.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        if not target:
            raise ValueError("target: expected host:port, got an empty string")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.target = target
        self.timeout_s = timeout_s
        self._raw = security.channel(target, options=grpc_options(max_message_bytes))
        self.channel = grpc.intercept_channel(self._raw, ClientTracingInterceptor())
        self.stub = self._stub(self.channel)

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Block until the channel is connected; grpc.FutureTimeoutError after `timeout_s`."""
        grpc.channel_ready_future(self._raw).result(timeout=timeout_s)

    def status(self) -> dict[str, Any]:
        return status_dict(self.stub.Status(spb.StatusRequest(), timeout=self.timeout_s))

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _prompt(p: str | Sequence[int]) -> Any:
    if isinstance(p, str):
        return spb.GeneratePrompt(text=p)
    return spb.GeneratePrompt(token_ids=spb.TokenIds(ids=list(p)))


class GeneratorClient(_Client):
    _stub = sgrpc.GeneratorStub

    def generate_groups(self, prompts: Sequence[str | Sequence[int]], n: int = 1, *,
                        temperature: float | None = None, top_p: float | None = None,
                        thinking_budget_tokens: int | None = None, answer_budget_tokens: int | None = None,
                        interruption: bool | None = None, budget_forcing: dict[str, Any] | None = None,
                        seed: int | None = None, tools: bool | None = None) -> Generated:
        """Sample `n` completions per prompt (text, or exact token ids); None = the job's setting.
        `budget_forcing`: the keyword arguments of `scalerl.generator.engine.budget_forcing` (token ids).
        `seed`: restart the service's sampling stream from it first (None: continue its stream).
        `tools`: episodes with the job's tools (None: the job's own default)."""
        request = spb.GenerateRequest(prompts=[_prompt(p) for p in prompts], samples_per_prompt=n)
        if seed is not None:
            request.seed = seed
        if tools is not None:
            request.tools = tools
        if budget_forcing is not None:
            bf = request.budget_forcing
            bf.SetInParent()
            if budget_forcing.get("max_thinking") is not None:
                bf.max_thinking_tokens = budget_forcing["max_thinking"]
            bf.answer_prefix_ids.extend(budget_forcing.get("answer_prefix_ids", ()))
            bf.min_thinking_tokens = budget_forcing.get("min_thinking", 0)
            bf.wait_ids.extend(budget_forcing.get("wait_ids", ()))
            bf.max_waits = budget_forcing.get("max_waits", 0)
        if temperature is not None:
            request.temperature = temperature
        if top_p is not None:
            request.top_p = top_p
        if thinking_budget_tokens is not None:
            request.thinking_budget_tokens = thinking_budget_tokens
        if answer_budget_tokens is not None:
            request.answer_budget_tokens = answer_budget_tokens
        if interruption is not None:
            request.interruption = interruption
        response = self.stub.Generate(request, timeout=self.timeout_s)
        return Generated([list(r.prompt_token_ids) for r in response.results],
                         [[from_proto(c) for c in r.completions] for r in response.results],
                         response.policy_version)

    def generate(self, prompts: Sequence[str | Sequence[int]], n: int = 1, **options: Any) -> list[Completion]:
        """The completions of `generate_groups`, flat and prompt-major (prompt i's at [i*n, (i+1)*n))."""
        return [c for group in self.generate_groups(prompts, n, **options).completions for c in group]

    def update_weights(self, policy: PolicyVersion) -> WeightUpdate:
        r = self.stub.UpdateWeights(to_proto(policy), timeout=self.timeout_s)
        return WeightUpdate(r.previous_version, r.policy_version, r.swapped, r.load_seconds)


class VerifierClient(_Client):
    _stub = sgrpc.VerifierStub

    def score(self, rollout: RolloutGroup) -> ScoredGroup:
        r = self.stub.Score(spb.ScoreRequest(rollout=to_proto(rollout)), timeout=self.timeout_s)
        return ScoredGroup(rollout=rollout, rewards=list(r.rewards), correct=list(r.correct))


class LearnerClient(_Client):
    _stub = sgrpc.LearnerStub


class CurriculumClient(_Client):
    _stub = sgrpc.CurriculumStub
