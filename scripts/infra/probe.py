#!/usr/bin/env python3
"""Readiness probes used by scripts/infra/*.sh.  Exit 0 when ready, 1 otherwise.

    probe.py kafka 127.0.0.1:9092 [--log build/infra/kafka/kafka.log]
        ready when an admin client can list topics (kafka-python); without kafka-python installed,
        when the port accepts connections and the broker logged that it started.
    probe.py minio http://127.0.0.1:9000
        ready when GET /minio/health/ready answers 200.
    probe.py http http://127.0.0.1:9090/-/ready
        ready when GET of that URL answers 200 (Prometheus, Jaeger's query API).
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path


def kafka_ready(bootstrap: str, log: str | None) -> bool:
    try:
        from kafka import KafkaAdminClient
    except ImportError:
        host, port = bootstrap.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            return False
        if log is None:
            return True
        text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
        # only the lines of the latest start count (spawn() writes a "===== ... starting" marker)
        return "Kafka Server started" in text.rsplit("===== ", 1)[-1]
    logging.disable(logging.CRITICAL)
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000,
                                 bootstrap_timeout_ms=3000, client_id="scalerl-probe")
    except Exception:
        return False
    try:
        admin.list_topics()
        return True
    except Exception:
        return False
    finally:
        admin.close()


def minio_ready(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint.rstrip("/") + "/minio/health/ready", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def http_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("service", choices=["kafka", "minio", "http"])
    ap.add_argument("address")
    ap.add_argument("--log")
    a = ap.parse_args()
    if a.service == "kafka":
        ok = kafka_ready(a.address, a.log)
    else:
        ok = minio_ready(a.address) if a.service == "minio" else http_ready(a.address)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
