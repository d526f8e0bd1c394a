"""Record a noisy consumer-group lag signal from the real Kafka broker into verifier_lag_signal.csv.

What it does (about 75 s of wall time): a producer thread appends records to a fresh 8-partition topic
in bursts (Poisson-sized bursts at random gaps: mean 40 records/s, 140 records/s between t = 25 s and
t = 40 s); a consumer thread in group `verifiers` drains it at a jittered service rate of ~90
records/s and commits after every poll; the main thread samples `KafkaBus.lag(group, topic)` every
0.25 s. The CSV (t_s, lag_records) feeds tests/unit/operator/test_autoscaler.py's flapping test.

    set -a; source build/infra.env; set +a
    python tests/data/record_lag_signal.py tests/data/verifier_lag_signal.csv
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import uuid

from kafka import KafkaConsumer

from scalerl.bus.kafka import KafkaBus

DURATION_S = 75.0
SAMPLE_EVERY_S = 0.25


def _produce(bus: KafkaBus, topic: str, t0: float, stop: threading.Event, rng: random.Random) -> None:
    i = 0
    while not stop.is_set():
        t = time.monotonic() - t0
        rate = 140.0 if 25.0 <= t < 40.0 else 40.0  # records/s
        gap = rng.expovariate(2.0)  # a burst every 0.5 s on average
        burst = max(0, round(rng.gauss(rate * gap, (rate * gap) ** 0.5 * 3)))
        for _ in range(burst):
            bus.publish_raw(topic, b"x", key=str(i).encode())
            i += 1
        bus.flush(timeout_s=10)
        stop.wait(gap)


def _consume(bus: KafkaBus, topic: str, stop: threading.Event, rng: random.Random) -> None:
    c = KafkaConsumer(topic, bootstrap_servers=bus.bootstrap, group_id="verifiers", client_id="recorder-consumer",
                      enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        while not stop.is_set():
            want = max(1, round(rng.gauss(90 * 0.2, 8)))  # ~90 records/s in 0.2 s slices
            got = c.poll(timeout_ms=200, max_records=want)
            if got:
                c.commit()
            stop.wait(max(0.0, 0.2 - 0.01))
    finally:
        c.close(autocommit=False)


def main(out: str) -> None:
    bus = KafkaBus(os.environ["KAFKA_BOOTSTRAP"], client_id="lag-recorder")
    topic = f"rec-{uuid.uuid4().hex[:8]}.rollouts"
    bus.ensure_topics([topic], partitions=8)
    stop = threading.Event()
    t0 = time.monotonic()
    threads = [threading.Thread(target=_produce, args=(bus, topic, t0, stop, random.Random(1)), daemon=True),
               threading.Thread(target=_consume, args=(bus, topic, stop, random.Random(2)), daemon=True)]
    for th in threads:
        th.start()
    rows = []
    try:
        while (t := time.monotonic() - t0) < DURATION_S:
            rows.append((round(t, 2), bus.lag("verifiers", topic)))
            time.sleep(SAMPLE_EVERY_S)
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=10)
        bus.delete_topics([topic])
        bus.close()
    with open(out, "w") as f:
        f.write("t_s,lag_records\n")
        f.writelines(f"{t},{lag}\n" for t, lag in rows)
    print(f"{len(rows)} samples over {rows[-1][0]:.1f} s, lag {min(r[1] for r in rows)}..{max(r[1] for r in rows)} "
          f"records -> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/verifier_lag_signal.csv")
