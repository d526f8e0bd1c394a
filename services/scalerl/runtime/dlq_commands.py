"""`scalerl dlq list | replay`: look at a job's dead letters and, once their cause is fixed, send them back.

    scalerl dlq list   --bus kafka://HOST:PORT --job JOB [--json]
    scalerl dlq replay --bus kafka://HOST:PORT --job JOB (--offset N ... | --reason CODE | --all) [--dry-run]

`JOB` is the topic prefix (the spec's `runtime.bus_prefix`, else its name). `list` prints one line per
dead letter of `<JOB>.dlq`: its offset there, where it came from (topic:partition@offset), the role that
parked it, when (UTC) and the reason; `--json` prints the same as one JSON object per line. `replay` copies
the chosen dead letters, bytes unchanged, back to their source topic, without the dead-letter headers and
with `replayed_from_dlq_offset`; their consumers validate them again (a record still bad is dead-lettered
again, with a new dead-letter offset). The dead letters themselves stay (the topic is a log).
SASL/TLS settings come from SCALERL_KAFKA_* (scalerl.bus.security), as for the roles.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from scalerl.bus.base import TOPIC_KINDS
from scalerl.bus.dlq import replay_headers

EXIT_BAD_INPUT = 2


def _fail(msg: str) -> int:
    print(f"scalerl dlq: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _text(headers: dict[str, bytes], name: str) -> str:
    return headers.get(name, b"").decode("utf-8", "replace")


def describe(offset: int, headers: dict[str, bytes]) -> dict[str, Any]:
    """One dead letter as a flat dict (the `list` row): dlq_offset, source, role, time_utc, reason."""
    ms = _text(headers, "dead_lettered_ms")
    when = dt.datetime.fromtimestamp(int(ms) / 1000, dt.UTC).isoformat(timespec="seconds") if ms.isdigit() else ""
    source = (f"{_text(headers, 'source_topic')}:{_text(headers, 'source_partition')}"
              f"@{_text(headers, 'source_offset')}")
    return {"dlq_offset": offset, "source": source, "role": _text(headers, "role"), "time_utc": when,
            "reason": _text(headers, "reason")}


def _open(args: argparse.Namespace) -> Any:
    from scalerl.bus.kafka import KafkaBus

    if not str(args.bus).startswith("kafka://") or not str(args.bus).removeprefix("kafka://"):
        raise ValueError(f"--bus {args.bus!r}: expected kafka://HOST:PORT (dead letters live on the broker)")
    if not args.job or any(c.isspace() for c in args.job):
        raise ValueError(f"--job {args.job!r}: expected the job's topic prefix (non-empty, no spaces)")
    from scalerl.bus.security import KafkaSecurity

    bus = KafkaBus(str(args.bus).removeprefix("kafka://"), security=KafkaSecurity.from_env())
    try:
        topics = bus.list_topics(f"{args.job}.")
    except ConnectionError as exc:  # unreachable, or refused our TLS/SASL settings: one line, exit 2
        bus.close()
        raise ValueError(f"--bus {args.bus!r}: {exc}") from None
    if f"{args.job}.dlq" not in topics:
        bus.close()
        raise ValueError(f"--job {args.job!r}: the broker has no topic {args.job}.dlq")
    return bus


def cmd_list(args: argparse.Namespace) -> int:
    try:
        bus = _open(args)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        for rec in bus.read_raw(f"{args.job}.dlq"):
            row = describe(rec.offset, rec.headers)
            if args.json:
                print(json.dumps(row))
            else:
                print(f"{row['dlq_offset']:>6}  {row['source']:<40} {row['role']:<20} {row['time_utc']:<25} "
                      f"{row['reason']}")
    finally:
        bus.close()
    return 0


def _chosen(args: argparse.Namespace, offset: int, reason: str) -> bool:
    if args.all:
        return True
    if args.offset:
        return offset in args.offset
    return bool(reason.split(":", 1)[0] == args.reason)


def cmd_replay(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.offset, args.reason, args.all))) != 1:
        return _fail("replay: give exactly one of --offset N (repeatable), --reason CODE, --all")
    try:
        bus = _open(args)
    except ValueError as exc:
        return _fail(str(exc))
    allowed = {f"{args.job}.{k}" for k in TOPIC_KINDS if k != "dlq"}
    replayed = skipped = 0
    try:
        for rec in bus.read_raw(f"{args.job}.dlq"):
            if not _chosen(args, rec.offset, _text(rec.headers, "reason")):
                continue
            target = _text(rec.headers, "source_topic")
            if target not in allowed:
                print(f"dlq offset {rec.offset}: source topic {target!r} is not one of the job's topics; "
                      "not replayed", file=sys.stderr)
                skipped += 1
                continue
            if not args.dry_run:
                bus.publish_raw(target, rec.value or b"", key=rec.key, headers=replay_headers(rec.headers, rec.offset))
            print(f"dlq offset {rec.offset} -> {target}{' (dry run)' if args.dry_run else ''}")
            replayed += 1
        bus.flush()
    finally:
        bus.close()
    print(f"{replayed} dead letters {'to replay' if args.dry_run else 'replayed'}, {skipped} skipped")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dlq = sub.add_parser("dlq", help="list a job's dead letters, or replay them after a fix")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True)
    for name, func, doc in (("list", cmd_list, "one line per dead letter"),
                            ("replay", cmd_replay, "send chosen dead letters back to their source topic")):
        sp = dsub.add_parser(name, help=doc)
        sp.add_argument("--bus", required=True, help="kafka://HOST:PORT")
        sp.add_argument("--job", required=True, help="the job's topic prefix (runtime.bus_prefix, else its name)")
        sp.set_defaults(func=func)
        if name == "list":
            sp.add_argument("--json", action="store_true", help="one JSON object per line")
        else:
            sp.add_argument("--offset", type=int, action="append", default=[], help="a dead-letter offset (repeatable)")
            sp.add_argument("--reason", help="every dead letter whose reason code is CODE, e.g. token_out_of_range")
            sp.add_argument("--all", action="store_true", help="every dead letter")
            sp.add_argument("--dry-run", action="store_true", help="print what would be replayed, send nothing")
