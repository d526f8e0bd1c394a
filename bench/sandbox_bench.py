"""`make bench` section "sandbox": how many executions scalerl.sandbox runs per second per core, beside the
physical limit of starting the same interpreter unsandboxed (`python -I -S -c SOURCE`, the same binary).

Two programs: (a) `print(1)`, (b) a typical unit-test run, a function of about 20 lines and 10 asserts.
Three ways: the sandbox with the namespaces this host allows, the sandbox with `use_namespaces=False` (the
path of a Pod without user namespaces), and the plain interpreter. Per way and program, --n executions one
after another: executions per wall second, and executions per CPU second, the CPU of this process and of
every process it reaped (launcher, init, worker), which is the rate one core sustains. Kernel work done
outside those processes (a network namespace is torn down by a kernel worker) is not in that CPU time; the
parallel run (as many executions at once as there are cores, --parallel-n of them) counts it, in wall
time, but also feels any other load on the machine, whose 1-minute load average is recorded.

    .venv/bin/python bench/sandbox_bench.py --out bench/results.json [--n 100] [--parallel-n 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from results_file import merge_sections
from scalerl.sandbox import Limits, Verdict, interpreter, isolation, run_python

TRIVIAL = "print(1)\n"
UNIT_TEST = '''
def merge_intervals(intervals):
    """Merge overlapping closed intervals [start, end]; touching ones merge too."""
    if not intervals:
        return []
    for start, end in intervals:
        if start > end:
            raise ValueError(f"bad interval {start}..{end}")
    ordered = sorted(intervals, key=lambda pair: (pair[0], pair[1]))
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    total = 0
    for start, end in merged:
        total += end - start
    assert total >= 0
    return [tuple(pair) for pair in merged]


assert merge_intervals([]) == []
assert merge_intervals([(1, 3)]) == [(1, 3)]
assert merge_intervals([(1, 3), (2, 6), (8, 10), (15, 18)]) == [(1, 6), (8, 10), (15, 18)]
assert merge_intervals([(1, 4), (4, 5)]) == [(1, 5)]
assert merge_intervals([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]
assert merge_intervals([(1, 10), (2, 3), (4, 5)]) == [(1, 10)]
assert merge_intervals([(0, 0), (0, 0)]) == [(0, 0)]
assert merge_intervals([(-3, -1), (-2, 2)]) == [(-3, 2)]
assert len(merge_intervals([(i, i + 1) for i in range(0, 100, 2)])) == 50
try:
    merge_intervals([(3, 1)])
    raise AssertionError("no error")
except ValueError:
    pass
print("all passed")
'''
PROGRAMS = {"trivial": (TRIVIAL, "1\n"), "unit_test": (UNIT_TEST, "all passed\n")}


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _sandboxed(source: str, expected: str, use_namespaces: bool) -> Callable[[], None]:
    limits = Limits(wall_s=30, use_namespaces=use_namespaces)

    def once() -> None:
        result = run_python(source, limits=limits)
        if result.verdict is not Verdict.OK or result.stdout != expected:
            raise RuntimeError(f"sandboxed run failed: {result}")

    return once


def _plain(source: str, expected: str) -> Callable[[], None]:
    python = interpreter()[0]

    def once() -> None:
        proc = subprocess.run([python, "-I", "-S", "-c", source], capture_output=True, check=True, timeout=30)
        if proc.stdout.decode() != expected:
            raise RuntimeError(f"plain run printed {proc.stdout!r}")

    return once


def measure(once: Callable[[], None], n: int) -> dict[str, float]:
    once()  # warm-up: page cache, bytecode caches
    cpu0, t0 = _cpu_s(), time.perf_counter()
    for _ in range(n):
        once()
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    return {
        "executions": n,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "per_wall_s": round(n / wall, 1),
        "per_cpu_s": round(n / cpu, 1),
        "cpu_ms_per_execution": round(1000 * cpu / n, 2),
        "wall_ms_per_execution": round(1000 * wall / n, 2),
    }


def measure_parallel(once: Callable[[], None], n: int, workers: int) -> dict[str, float]:
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda _: once(), range(workers)))  # warm-up
        t0 = time.perf_counter()
        list(pool.map(lambda _: once(), range(n)))
    wall = time.perf_counter() - t0
    return {
        "executions": n,
        "workers": workers,
        "wall_s": round(wall, 3),
        "per_wall_s_per_core": round(n / wall / workers, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--n", type=int, default=100, help="sequential executions per way and program")
    ap.add_argument("--parallel-n", type=int, default=200, help="executions of the parallel run (0: none)")
    args = ap.parse_args()

    cores = os.cpu_count() or 1
    section: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cores": cores,
            "loadavg_1min_at_start": os.getloadavg()[0],
            "interpreter": interpreter()[0],
            "nice": os.nice(0),
        },
        "layers": {layer.name: layer.active for layer in isolation(True)},
        "layers_no_namespaces": {layer.name: layer.active for layer in isolation(False)},
        "units": {
            "per_cpu_s": "executions per CPU second of this process and all it reaped (= per core)",
            "per_wall_s": "executions per wall second, one at a time",
            "per_wall_s_per_core": "executions per wall second with `workers` at once, divided by workers",
            "ratio_*": "plain / sandbox executions per CPU second (how many times dearer the sandbox is)",
        },
    }
    for name, (source, expected) in PROGRAMS.items():
        ways = {
            "sandbox": _sandboxed(source, expected, True),
            "sandbox_no_namespaces": _sandboxed(source, expected, False),
            "plain": _plain(source, expected),
        }
        row: dict[str, Any] = {}
        for way, once in ways.items():
            print(f"bench: sandbox, {name}, {way}: {args.n} executions...", file=sys.stderr)
            row[way] = measure(once, args.n)
        row["ratio_plain_over_sandbox"] = round(row["plain"]["per_cpu_s"] / row["sandbox"]["per_cpu_s"], 2)
        row["ratio_plain_over_sandbox_no_namespaces"] = round(
            row["plain"]["per_cpu_s"] / row["sandbox_no_namespaces"]["per_cpu_s"], 2
        )
        if args.parallel_n:
            print(f"bench: sandbox, {name}: {args.parallel_n} executions, {cores} at once...", file=sys.stderr)
            row["sandbox_parallel"] = measure_parallel(ways["sandbox"], args.parallel_n, cores)
            row["plain_parallel"] = measure_parallel(ways["plain"], args.parallel_n, cores)
        section[name] = row
        print(
            f"sandbox {name}: {row['sandbox']['per_cpu_s']:.0f}/CPU-s ({row['sandbox']['cpu_ms_per_execution']:.1f} "
            f"ms CPU each), no namespaces {row['sandbox_no_namespaces']['per_cpu_s']:.0f}/CPU-s, plain python "
            f"{row['plain']['per_cpu_s']:.0f}/CPU-s -> {row['ratio_plain_over_sandbox']:.2f}x dearer; one at a "
            f"time {row['sandbox']['per_wall_s']:.0f}/s vs {row['plain']['per_wall_s']:.0f}/s"
        )
    print(f"wrote the sandbox section of {merge_sections(args.out, {'sandbox': section})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
