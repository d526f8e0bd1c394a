"""Distributed-mode measurements for `make bench` (real Kafka broker and MinIO from build/infra.env).

1. bus: rollout groups of the quickstart's shape through Kafka — produced (publish + flush) and consumed
   (a consumer group reading them back), in messages/s and MB/s of encoded (protobuf) payload.
2. weight swap: learner publishes the quickstart model's weights to MinIO and announces them on the
   policy topic → a generator (background policy reader) has fetched, verified and loaded them.
   Reported: median seconds over repeats of a full version (a snapshot: bench/weight_sync_bench.py measures
   deltas), and its stored size.
3. steps/hour of distributed mode (curriculum, generator, verifier, learner as processes over Kafka +
   MinIO) vs embedded mode (one process, in-memory bus), same spec and SFT start, same step count.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from scalerl.bus.background import BackgroundConsumer
from scalerl.bus.base import TopicNames
from scalerl.bus.kafka import KafkaBus
from scalerl.config import JobSpec, load_spec
from scalerl.generator.role import GeneratorRole
from scalerl.generator.torch_engine import TorchEngine
from scalerl.messages import RolloutGroup
from scalerl.parts import make_task
from scalerl.rpc.convert import encode_envelope
from scalerl.runtime.embedded import EmbeddedRun
from scalerl.runtime.launcher import LocalCluster
from scalerl.runtime.roles import ensure_job_topics
from scalerl.runtime.setup import job_limits
from scalerl.store.s3 import S3Store
from scalerl.weightsync.publisher import WeightPublisher


def available() -> bool:
    return all(os.environ.get(k) for k in ("KAFKA_BOOTSTRAP", "S3_ENDPOINT", "S3_ACCESS_KEY", "S3_SECRET_KEY"))


def bench_bus(groups: list[RolloutGroup], repeats: int) -> dict[str, Any]:
    """Each repeat: a fresh 4-partition topic and a consumer group that has joined it (empty); publish
    every group and flush (produce time), then the consumer reads them all (consume time)."""
    bus = KafkaBus(os.environ["KAFKA_BOOTSTRAP"])
    size = sum(len(encode_envelope(g)) for g in groups)
    produce, consume, topics = [], [], []
    try:
        for _ in range(repeats):
            topic = f"bench-{uuid.uuid4().hex[:8]}.rollouts"
            topics.append(topic)
            bus.ensure_topics([topic], partitions=4)
            consumer = bus.consumer([topic], f"bench-{uuid.uuid4().hex[:8]}")
            consumer.poll(timeout_s=3.0)  # join the group (nothing to read yet)
            t0 = time.perf_counter()
            for g in groups:
                bus.publish(topic, g, key=g.task.prompt_id)
            bus.flush()
            produce.append(time.perf_counter() - t0)
            t0, n_got = time.perf_counter(), 0
            while n_got < len(groups):
                n_got += len(consumer.poll(timeout_s=5.0))
            consume.append(time.perf_counter() - t0)
            consumer.close()
    finally:
        bus.delete_topics(topics)
        bus.close()
    n = len(groups)
    p, c = statistics.median(produce), statistics.median(consume)
    return {"groups": n, "encoded_mb": size / 1e6, "group_kb": size / n / 1e3,
            "produce_msgs_per_s": n / p, "produce_mb_per_s": size / 1e6 / p,
            "consume_msgs_per_s": n / c, "consume_mb_per_s": size / 1e6 / c}


def bench_weight_swap(spec: JobSpec, model: Any, tok: Any, repeats: int, engine: Any = None) -> dict[str, Any]:
    """Publish (upload to MinIO + announce on Kafka) -> a generator role's engine holds the weights
    (`engine`: the torch engine over `model` when None), seconds per swap."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    job = spec.model_copy(update={"name": name})
    bus = KafkaBus(os.environ["KAFKA_BOOTSTRAP"])
    ensure_job_topics(bus, job)
    store = S3Store.from_url(f"s3://{name}/weights")
    topics = TopicNames.of(job)
    engine = engine if engine is not None else TorchEngine(model, tok, seed=0)
    limits = job_limits(job, make_task(job), len(tok))
    role = GeneratorRole(job, engine, tok, bus, store, topics, limits, group=topics.group("generators"))
    role.policy = BackgroundConsumer(role.policy)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    latencies = []
    publisher = WeightPublisher(store, delta=False)
    try:
        for v in range(1, repeats + 2):
            t0 = time.perf_counter()
            pv = publisher.publish(v, sd)
            bus.publish(topics.policy, pv, key="policy")
            bus.flush()
            while role.loaded != pv:
                role.sync_policy()
                time.sleep(0.001)
            if v > 1:  # the first one includes the policy reader's start-up
                latencies.append(time.perf_counter() - t0)
        size = publisher.last.stored_bytes if publisher.last is not None else 0
    finally:
        role.policy.close()
        role.prompts.close()
        bus.delete_topics(topics.all())
        bus.close()
    return {"weights_mb": size / 1e6, "publish_to_swap_s_median": statistics.median(latencies),
            "publish_to_swap_s_max": max(latencies), "repeats": len(latencies)}


def bench_distributed_vs_embedded(spec_path: str, overrides: list[str], sft_dir: Path, steps: int,
                                  work: Path) -> dict[str, Any]:
    base = [*overrides, f"train.steps={steps}", f"eval.every_steps={steps}", f"model.init_checkpoint={sft_dir}",
            "off_policy.mode=pipeline"]
    emb = EmbeddedRun(load_spec(spec_path, base), work / "embedded", show_progress=False).run()
    name = f"bench-{uuid.uuid4().hex[:8]}"
    spec = load_spec(spec_path, [*base, f"name={name}"])
    cluster = LocalCluster(spec, work / "distributed", f"kafka://{os.environ['KAFKA_BOOTSTRAP']}",
                           f"s3://{name}/job", generators=1, verifiers=1)
    cluster.start_all()
    try:
        rc = cluster.wait_learner(timeout_s=3600)
    finally:
        cluster.stop_all()
    if rc != 0:
        raise RuntimeError(f"distributed learner failed:\n{cluster.tail('learner-0')}")
    dist = cluster.summary()
    out = {}
    for key, s in (("embedded", emb), ("distributed", dist)):
        out[key] = {"steps": s["steps"], "train_wall_s": s["train_wall_s"],
                    "steps_per_hour": s["steps"] / (s["train_wall_s"] / 3600),
                    "final_pass_rate": s["final_pass_rate"]}
    out["steps_per_hour_ratio_distributed_over_embedded"] = (
        out["distributed"]["steps_per_hour"] / out["embedded"]["steps_per_hour"])
    out["processes"] = "curriculum, 1 generator, 1 verifier, learner (+ Kafka and MinIO) on the same cores"
    return out
