"""The generator as a service (`scalerl serve generator`): the policy's engine on the bus, with weights
from the store (or the learner's broadcast) swapped in flight. Kept apart from runtime/roles.py so the
CPU roles (verifier, curriculum) never import torch or transformers (about 10 s of CPU per start)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from scalerl.bus.background import BackgroundConsumer
from scalerl.generator.factory import make_engine
from scalerl.generator.role import GeneratorRole
from scalerl.model.factory import embedding_rows, load_model_and_tokenizer, resolve_device
from scalerl.parts import configure_threads, make_task, seed_everything
from scalerl.runtime.limits import job_limits
from scalerl.runtime.roles import POLL_S, ServiceContext, input_lag, retry_io, role_seed
from scalerl.telemetry.steps import StepTimes

log = logging.getLogger(__name__)


class GeneratorService:
    def __init__(self, ctx: ServiceContext) -> None:
        spec = ctx.spec
        seed_everything(spec.seed)
        configure_threads(spec)
        self.ctx = ctx
        self.bus, self.store, self.topics = ctx.open()
        model, self.tokenizer = load_model_and_tokenizer(spec.model, spec.seed)  # weights come from the store
        model.to(resolve_device(spec.model.device)).eval()
        self.engine = make_engine(spec, model, self.tokenizer, seed=role_seed(spec, ctx.role_id),
                                  workdir=ctx.out_dir / f"{ctx.role_id}-init")
        log.info("%s: sampling with %s (generation.engine %s)", ctx.role_id, type(self.engine).__name__,
                 spec.generation.engine)
        self.engine_lock = threading.Lock()  # the bus loop and gRPC Generate/UpdateWeights share the engine
        limits = job_limits(spec, make_task(spec), embedding_rows(model))
        self.role = GeneratorRole(spec, self.engine, self.tokenizer, self.bus, self.store, self.topics, limits,
                                  generator_id=ctx.role_id, group=self.topics.group("generators"))
        # Announcements are read in the background: the check between decode steps costs no I/O.
        self.role.policy = BackgroundConsumer(self.role.policy, name="policy-reader")
        self.steps = StepTimes()
        self.prompts_consumed = 0

    def ready(self) -> bool:
        """Ready once it holds an announced policy (it never samples with untrained weights)."""
        return self.role.loaded is not None

    def status(self) -> dict[str, Any]:
        return {"role": "generator", "id": self.ctx.role_id, "policy_version": self.engine.version,
                "ready": self.ready(), "tokens_generated": self.role.gen_tokens,
                "groups_generated": self.role.groups_out, "prompts_consumed": self.prompts_consumed,
                "staleness_versions": self.role.staleness,
                "swaps_in_flight": self.engine.swaps_in_flight,
                **self.role.weight_counters(),
                "dead_lettered": dict(self.role.dead.counts),
                "lag": input_lag(self.bus, self.role.group, self.topics.prompts)}

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self.ready():  # wait for the learner's first announcement
            update = retry_io(lambda: self.role.poll_policy(timeout_s=POLL_S), stop, what="policy fetch")
            if update is not None:
                self.engine.load_weights(update[1], update[0])

        def once() -> int:
            with self.engine_lock:
                t0 = time.perf_counter()
                n = self.role.run_once(timeout_s=POLL_S)
            if n:
                self.steps.observe(time.perf_counter() - t0)
                self.prompts_consumed += n
            return n

        while not stop.is_set():
            retry_io(once, stop, what="generation batch", on_error=self.role.rewind)
        self.close()

    def close(self) -> None:
        self.role.close()
        self.role.prompts.close()
        self.role.policy.close()
        self.bus.flush()
        self.bus.close()
