"""`python -m scalerl_operator`: run the RLJob operator (kopf), standalone or behind a Lease.

    python -m scalerl_operator --all-namespaces
    python -m scalerl_operator --namespace team-a --namespace team-b --leader-election \\
        --lease-name scalerl-operator-leader --lease-namespace scalerl

Thin: parse → validate (exit 2 with one line naming the flag) → serve /healthz and /readyz on
--liveness (scalerl_operator.control.health: from the start, so a standby waiting for the Lease is healthy
and its probes never kill it) → wait for the Lease (with --leader-election) → kopf.run until
SIGTERM/SIGINT (exit 0) or until the Lease is lost (exit 1: the pod restarts and queues up as a
standby). kopf's own peering is off (`standalone`): exclusivity
comes from the Lease (see scalerl_operator.control.leader for why).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import sys
import threading

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scalerl_operator", description=__doc__.split("\n")[0])
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch RLJobs in every namespace")
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    p.add_argument("--liveness", help="health endpoint (/healthz and /readyz, standby or leader), "
                   "e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--leader-election", action="store_true", help="reconcile only while holding a Lease")
    p.add_argument("--lease-name", default="scalerl-operator-leader", help="Lease name")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE") or "default",
                   help="namespace of the Lease (default: $POD_NAMESPACE, else default)")
    p.add_argument("--lease-duration-seconds", type=int, default=15,
                   help="how long a Lease holds without renewal, s (renewal deadline 2/3 of it)")
    p.add_argument("--identity", default=None, help="Lease holder identity (default: $POD_NAME, else host-pid)")
    p.add_argument("--interval-seconds", type=float, default=15.0, help="status + autoscaler period per RLJob, s")
    p.add_argument("--workers", type=int, default=4,
                   help="threads of the periodic passes, shared by every RLJob (not one per RLJob)")
    p.add_argument("--backoff-max-seconds", type=float, default=60.0,
                   help="cap of the retry delay (exponential, jittered) of an RLJob whose pass fails, s")
    p.add_argument("--kafka-timeout-seconds", type=float, default=10.0, help="per Kafka request, s")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (0: none)")
    p.add_argument("--log-level", default=os.environ.get("SCALERL_LOG_LEVEL", "info"),
                   choices=["debug", "info", "warning", "error"], help="log level")
    return p


def _problem(args: argparse.Namespace) -> str | None:
    if args.lease_duration_seconds < 3:
        return f"--lease-duration-seconds: must be >= 3, got {args.lease_duration_seconds}"
    if args.interval_seconds <= 0:
        return f"--interval-seconds: must be > 0, got {args.interval_seconds}"
    if not 1 <= args.workers <= 256:
        return f"--workers: must be 1..256, got {args.workers}"
    if args.backoff_max_seconds <= 0:
        return f"--backoff-max-seconds: must be > 0, got {args.backoff_max_seconds}"
    if args.kafka_timeout_seconds <= 0:
        return f"--kafka-timeout-seconds: must be > 0, got {args.kafka_timeout_seconds}"
    if args.liveness:
        from scalerl_operator.control.health import parse_endpoint

        try:
            parse_endpoint(args.liveness)
        except ValueError as exc:
            return str(exc)
    if not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port: must be 0..65535, got {args.metrics_port}"
    from scalerl.rpc.sidetls import token_file_problems
    from scalerl_operator.control.rpc_certmanager import configured_mode
    from scalerl_operator.render.images import image_defaults
    from scalerl_operator.render.names import SCRAPE_TOKEN_FILE_ENV
    from scalerl_operator.render.netpol import network_defaults

    if token_problem := token_file_problems(os.environ, SCRAPE_TOKEN_FILE_ENV):  # the chart's scrape token
        return token_problem[0]
    try:
        image_defaults(os.environ)  # the chart's image defaults for RLJobs (SCALERL_DEFAULT_IMAGE*)
        network_defaults(os.environ)  # the chart's networkPolicy.* (SCALERL_NETWORK_POLICIES, SCALERL_SCRAPE_FROM)
        configured_mode(os.environ)  # the chart's rpc.certificates (SCALERL_RPC_CERTIFICATES)
    except ValueError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = _problem(args)
    if problem:
        print(f"scalerl-operator: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import kopf

    from scalerl_operator.cluster.kube import Kube, identity, load_client
    from scalerl_operator.control import handlers  # noqa: F401  (importing it registers the kopf handlers)
    from scalerl_operator.control.health import HealthState, parse_endpoint, serve
    from scalerl_operator.control.leader import LeaderElector
    from scalerl_operator.control.runtime import OperatorConfig

    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    config = OperatorConfig(interval_s=args.interval_seconds, kafka_timeout_s=args.kafka_timeout_seconds,
                            kubeconfig=os.environ.get("KUBECONFIG") or None, workers=args.workers,
                            backoff_max_s=args.backoff_max_seconds)
    # kopf waits for its stop flag in a thread; the operator's cleanup activity resolves it when kopf
    # stops for another reason (SIGTERM), or that thread would block the exit
    stop_kopf: concurrent.futures.Future[None] = concurrent.futures.Future()
    stop, lost, ready = threading.Event(), threading.Event(), threading.Event()
    health = HealthState()
    server = serve(health, *parse_endpoint(args.liveness)) if args.liveness else None
    elector = None
    if args.leader_election:
        d = args.lease_duration_seconds
        elector = LeaderElector(Kube(load_client(config.kubeconfig)), args.lease_namespace, args.lease_name,
                                args.identity or identity(), lease_duration_s=d, renew_deadline_s=d * 2 / 3,
                                retry_period_s=d * 2 / 15)
        logging.getLogger("scalerl_operator").info("waiting for lease %s/%s as %s", args.lease_namespace,
                                                   args.lease_name, elector.identity)
        if not elector.acquire(stop):
            return 0

        def on_lost() -> None:
            lost.set()
            if not stop_kopf.done():
                stop_kopf.set_result(None)

        elector.keep(stop, on_lost=on_lost)
    health.set("starting")

    def on_ready() -> None:
        while not stop.is_set():
            if ready.wait(0.5):
                health.set("leader")
                return

    threading.Thread(target=on_ready, name="kopf-ready", daemon=True).start()
    try:
        kopf.run(clusterwide=args.all_namespaces or not args.namespace, namespaces=args.namespace,
                 standalone=True, stop_flag=stop_kopf, ready_flag=ready,
                 memo=kopf.Memo(config=config, stop_flag=stop_kopf))
    finally:
        health.set("stopping")
        stop.set()
        if server is not None:
            server.shutdown()
        if elector is not None and not lost.is_set():
            elector.release()
    return 1 if lost.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
