"""The generator's gRPC service (`scalerl.v1.Generator`): Generate, UpdateWeights, Status.

Generate samples with the engine's current weights and the job's defaults (sampling and length rules
of `generation`, as the bus role uses them: `role.encode_prompt`, `role.length_control`); a request
may override temperature, top_p, the budgets and interruption. A job with tools answers with episodes
(`scalerl.generator.episode`, the role's own runner) unless the request sets `tools: false`.
UpdateWeights fetches an announced `PolicyVersion` from the store (`scalerl.weightsync`: the deltas
since the version it holds, or a snapshot and the deltas after it; every shard and tensor checksummed)
and loads it.

Decisions:
1. One lock (`engine_lock`, pass the bus role's own to share it) serialises every use of the engine:
   a Generate never sees a half-loaded swap and never interleaves with the role loop's batches. The
   weights are fetched outside the lock (seconds from S3), only the copy into the model is inside.
2. UpdateWeights only moves forward: a version below the one the engine serves is refused
   (PERMISSION_DENIED), whoever asks. Versions never repeat across learner restarts (a resumed learner
   numbers past every version ever uploaded, `scalerl.learner.lineage`), so no legitimate call goes
   back, and a rollback to old weights is the attack this stops. The version the engine already serves
   is acknowledged with `swapped = false` and not loaded again (idempotent retries, and a restarted
   learner announcing its checkpoint's version again with the same weights).
   Only the weights this job published are loaded: the URI must be exactly where the learner's
   `WeightPublisher` puts that version and checksum in the generator's own store (`WeightReader.fetch`
   raises ForeignWeights before fetching anything), else PERMISSION_DENIED. Who may call UpdateWeights at
   all (the learner) is `scalerl.rpc.security`.
3. A thinking budget below the job's interruption window narrows the window to fit the budget
   ([min(lo, budget), min(hi, budget)]).
4. Errors: a bad request -> INVALID_ARGUMENT naming the field; no store -> FAILED_PRECONDITION; a
   missing manifest or shard -> NOT_FOUND; a corrupt shard or a checksum mismatch -> DATA_LOSS (either way
   the generator has asked the learner for a snapshot); weights that do not fit the
   model -> INVALID_ARGUMENT. The loaded version is unchanged after any of them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc

from scalerl.config import JobSpec
from scalerl.generator.engine import GenerationEngine, LengthControl, SamplingParams, budget_forcing
from scalerl.generator.episode import EpisodeRunner
from scalerl.generator.role import encode_prompt, length_control
from scalerl.messages import MessageError, PolicyVersion
from scalerl.rpc.convert import from_proto, to_proto
from scalerl.rpc.gen.scalerl.v1 import services_pb2 as spb
from scalerl.rpc.gen.scalerl.v1 import services_pb2_grpc as sgrpc
from scalerl.rpc.server import abort, status_reply
from scalerl.store.base import Store, StoreError
from scalerl.telemetry.metrics import RoleMetrics
from scalerl.weightsync.factory import make_reader
from scalerl.weightsync.reader import ForeignWeights

MAX_SAMPLES_PER_PROMPT = 1024
MAX_BUDGET_TOKENS = 1 << 20
MAX_WAITS = 64
_COUNTERS = ("tokens_generated", "groups_generated", "requests_served", "weight_updates")


def _store_error_code(exc: StoreError) -> grpc.StatusCode:
    if isinstance(exc, ForeignWeights):
        return grpc.StatusCode.PERMISSION_DENIED
    text = str(exc.__cause__ or exc)
    if any(word in text for word in ("checksum", "corrupt", "CRC-32", "decodes")):
        return grpc.StatusCode.DATA_LOSS
    if text.startswith("no object"):
        return grpc.StatusCode.NOT_FOUND
    return grpc.StatusCode.FAILED_PRECONDITION


class GeneratorServicer(sgrpc.GeneratorServicer):  # type: ignore[misc]
    service_name = "scalerl.v1.Generator"

    def __init__(self, engine: GenerationEngine, tokenizer: Any, spec: JobSpec, *, store: Store | None = None,
                 generator_id: str = "generator-0", metrics: RoleMetrics | None = None,
                 ready: Callable[[], bool] | None = None,
                 status_fn: Callable[[], Mapping[str, Any]] | None = None,
                 engine_lock: threading.Lock | None = None, max_rows: int = 4096,
                 episodes: EpisodeRunner | None = None) -> None:
        """status_fn: the bus role's counters (tokens_generated, groups_generated are added to this
        servicer's own; any other GeneratorStatus field it returns is taken as is). episodes: the job's episode
        runner (`environment.tools`), for requests with tools."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.spec = spec
        self.store = store
        self.generator_id = generator_id
        self.metrics = metrics
        self.ready = ready or (lambda: True)
        self.status_fn = status_fn
        self.engine_lock = engine_lock or threading.Lock()
        self.max_rows = max_rows
        self.vocab_size = len(tokenizer)
        self.sampling = SamplingParams(spec.generation.temperature, spec.generation.top_p)
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._counts_lock = threading.Lock()
        self.loaded: PolicyVersion | None = None  # the last announcement UpdateWeights loaded
        self.weights = make_reader(spec, store) if store is not None else None  # (weightsync)
        self.fetch_lock = threading.Lock()  # one fetch at a time into the reader's copy
        self.episodes = episodes

    def register(self, server: grpc.Server) -> None:
        sgrpc.add_GeneratorServicer_to_server(self, server)

    def _count(self, **inc: int) -> None:
        with self._counts_lock:
            for k, v in inc.items():
                self._counts[k] += v

    # ---- Generate ---------------------------------------------------------------------------------

    def _tools(self, request: Any) -> EpisodeRunner | None:
        """The episode runner when the request has tools (explicitly, or by the job's default), else None."""
        wanted = request.tools if request.HasField("tools") else self.episodes is not None
        if not wanted:
            return None
        if self.episodes is None:
            raise ValueError("tools: this job has no tools (environment.tools is empty)")
        if request.HasField("budget_forcing"):
            raise ValueError("tools: not with budget_forcing (set tools: false for budget forcing)")
        return self.episodes

    def _prompt_ids(self, request: Any, episodes: EpisodeRunner | None = None) -> list[list[int]]:
        if not request.prompts:
            raise ValueError("prompts: at least one prompt is required")
        out = []
        for i, p in enumerate(request.prompts):
            kind = p.WhichOneof("prompt")
            if kind is None:
                raise ValueError(f"prompts[{i}]: set text or token_ids")
            if kind == "text":
                out.append(encode_prompt(self.tokenizer, episodes.prompt(p.text) if episodes else p.text))
                continue
            ids = list(p.token_ids.ids)
            if not ids:
                raise ValueError(f"prompts[{i}].token_ids: empty")
            self._check_vocab(f"prompts[{i}].token_ids", ids)
            out.append(ids)
        return out

    def _check_vocab(self, name: str, ids: Sequence[int]) -> None:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{name}: {bad[:3]} outside the vocabulary 0..{self.vocab_size - 1}")

    def _options(self, request: Any, rows: int) -> tuple[int, SamplingParams, LengthControl]:
        n = request.samples_per_prompt if request.HasField("samples_per_prompt") else 1
        if not 1 <= n <= MAX_SAMPLES_PER_PROMPT:
            raise ValueError(f"samples_per_prompt: must be in 1..{MAX_SAMPLES_PER_PROMPT}, got {n}")
        if rows * n > self.max_rows:
            raise ValueError(f"prompts x samples_per_prompt = {rows * n} rows, more than this server's "
                             f"max_rows {self.max_rows}")
        temperature = request.temperature if request.HasField("temperature") else self.sampling.temperature
        if not 0.0 <= temperature <= 10.0:
            raise ValueError(f"temperature: must be in [0, 10] (0 = greedy), got {temperature}")
        top_p = request.top_p if request.HasField("top_p") else self.sampling.top_p
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {top_p}")
        interrupt = request.interruption if request.HasField("interruption") else None
        length = length_control(self.spec, self.tokenizer, interrupt=interrupt)
        think = request.thinking_budget_tokens if request.HasField("thinking_budget_tokens") else length.thinking_budget
        answer = request.answer_budget_tokens if request.HasField("answer_budget_tokens") else length.answer_budget
        for name, value in (("thinking_budget_tokens", think), ("answer_budget_tokens", answer)):
            if not 1 <= value <= MAX_BUDGET_TOKENS:
                raise ValueError(f"{name}: must be in 1..{MAX_BUDGET_TOKENS}, got {value}")
        lo, hi = length.window
        length = dataclasses.replace(length, thinking_budget=think, answer_budget=answer,
                                     window=(min(lo, think), min(hi, think)))
        if request.HasField("budget_forcing"):
            length = self._budget_forcing(request.budget_forcing, length)
        return n, SamplingParams(temperature, top_p), length

    def _budget_forcing(self, bf: Any, length: LengthControl) -> LengthControl:
        for name in ("answer_prefix_ids", "wait_ids"):
            self._check_vocab(f"budget_forcing.{name}", getattr(bf, name))
        top = bf.max_thinking_tokens if bf.HasField("max_thinking_tokens") else None
        if top is not None and not 1 <= top <= MAX_BUDGET_TOKENS:
            raise ValueError(f"budget_forcing.max_thinking_tokens: must be in 1..{MAX_BUDGET_TOKENS}, got {top}")
        if not 0 <= bf.min_thinking_tokens <= MAX_BUDGET_TOKENS:
            raise ValueError(f"budget_forcing.min_thinking_tokens: must be in 0..{MAX_BUDGET_TOKENS}, "
                             f"got {bf.min_thinking_tokens}")
        if not 0 <= bf.max_waits <= MAX_WAITS:
            raise ValueError(f"budget_forcing.max_waits: must be in 0..{MAX_WAITS}, got {bf.max_waits}")
        if bf.max_waits and not bf.wait_ids:
            raise ValueError("budget_forcing.wait_ids: required when max_waits > 0 (the tokens forced in place "
                             "of an early </think>)")
        return budget_forcing(length, max_thinking=top, answer_prefix_ids=tuple(bf.answer_prefix_ids),
                              min_thinking=bf.min_thinking_tokens, wait_ids=tuple(bf.wait_ids),
                              max_waits=bf.max_waits)

    def Generate(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        try:
            episodes = self._tools(request)
            prompts = self._prompt_ids(request, episodes)
            n, sampling, length = self._options(request, len(prompts))
        except ValueError as exc:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        flat = [p for p in prompts for _ in range(n)]
        t0 = time.perf_counter()
        with self.engine_lock:
            try:
                if request.HasField("seed"):
                    self.engine.reseed(request.seed)
                comps = (episodes or self.engine).generate(flat, sampling, length)
            except ValueError as exc:  # e.g. a prompt that leaves no room under the model's positions
                abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            version = self.engine.version
        elapsed_s = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for c in comps)
        self._count(tokens_generated=tokens, groups_generated=len(prompts), requests_served=1)
        if self.metrics is not None:
            self.metrics.tokens.inc(tokens)
            self.metrics.step_seconds.observe(elapsed_s)
        response = spb.GenerateResponse(policy_version=version)
        for i, ids in enumerate(prompts):
            result = response.results.add()
            result.prompt_token_ids.extend(ids)
            result.completions.extend(to_proto(c) for c in comps[i * n:(i + 1) * n])
        return response

    # ---- UpdateWeights ----------------------------------------------------------------------------

    def UpdateWeights(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        try:
            pv: PolicyVersion = from_proto(request)
        except MessageError as exc:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if pv.version < 0:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"version: must be >= 0, got {pv.version}")
        reader = self.weights
        if reader is None:
            abort(context, grpc.StatusCode.FAILED_PRECONDITION,
                  "this generator has no object store to fetch weights from (start it with a store)")
        serving = self.engine.version
        if pv.version < serving:
            abort(context, grpc.StatusCode.PERMISSION_DENIED, f"version {pv.version} is older than version "
                  f"{serving} this generator serves: policy versions only move forward")
        if pv == self.loaded or pv.version == serving:
            return spb.UpdateWeightsResponse(previous_version=serving, policy_version=serving, swapped=False)
        t0 = time.perf_counter()
        with self.fetch_lock:  # the copy a fetch fills is the one loaded: no other fetch in between
            try:
                state_dict = reader.fetch(pv)
            except StoreError as exc:
                abort(context, _store_error_code(exc), str(exc))
            with self.engine_lock:
                previous = self.engine.version
                if pv.version <= previous:  # a concurrent call got there first (this version or a newer one)
                    return spb.UpdateWeightsResponse(previous_version=previous, policy_version=previous,
                                                     swapped=False)
                try:
                    self.engine.load_weights(state_dict, pv.version)
                except (KeyError, RuntimeError, ValueError) as exc:
                    abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"weights of version {pv.version} do not "
                          f"fit the model: {exc}")
                self.loaded = pv
        load_s = time.perf_counter() - t0
        self._count(weight_updates=1)
        if self.metrics is not None:
            self.metrics.policy_version.set(pv.version)
        return spb.UpdateWeightsResponse(previous_version=previous, policy_version=pv.version, swapped=True,
                                         load_seconds=load_s)

    # ---- Status -----------------------------------------------------------------------------------

    def Status(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC name)
        with self._counts_lock:
            own = dict(self._counts)
        extra = dict(self.status_fn()) if self.status_fn is not None else {}
        for k in _COUNTERS:
            if k in extra:
                own[k] += int(extra.pop(k))
        msg = spb.GeneratorStatus(role="generator", id=self.generator_id, ready=bool(self.ready()),
                                  policy_version=self.engine.version, **own)
        return status_reply(msg, lambda: extra, context)
