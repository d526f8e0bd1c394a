"""`scalerl score SPEC COMPLETIONS.jsonl`: grade completions you give with the spec's task and verifier.

    scalerl score examples/code.yaml completions.jsonl
    scalerl score examples/quickstart.yaml answers.jsonl --set task.data_seed=3 --out scores.jsonl

How a user checks a new task or verifier before spending compute on it. Each line of COMPLETIONS is one
JSON object: `"completion"` (the model's text after the prompt), one of `"prompt_id"` (a problem id of
the task, train or eval split) or `"prompt"` (a problem's prompt text, exactly), and optionally
`"finish_reason"` ("stop", default, or "length": a truncated completion is wrong unread, as in a run).
Every line is checked before anything is graded: problems are printed one line each (FILE:LINE and what
is wrong) with exit status 2.

Each completion is graded as a run grades it (`Task.grade` under the verifier's rules, code in the
sandbox with the task's limits) and printed as one JSON line, in input order: `line`, `prompt_id`,
`reward` (the spec's task.reward_correct / reward_incorrect; the overlong penalty of
length_control: length_penalty needs token counts and is not applied here), `correct`, `verdict`,
`seconds` (wall-clock time of grading it, in seconds), and where the task gives them `tests_passed` (the
fraction of asserts that passed) and `detail`. A summary goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scalerl.endpoints import output_file_problem

EXIT_BAD_INPUT = 2
MAX_PROBLEMS_SHOWN = 20
FINISH_REASONS = ("stop", "length")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("score", help="grade completions you give with a spec's task and verifier "
                              "(one JSON line each: reward, correct, verdict, seconds)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="job spec YAML whose task and verifier grade the completions")
    p.add_argument("completions", type=Path, help='JSONL: {"prompt_id" or "prompt", "completion", "finish_reason"?}')
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec field by dotted path (repeatable)")
    p.add_argument("--out", type=Path, help="write the JSON lines here instead of stdout")
    p.set_defaults(func=cmd_score)


def _fail(problems: list[str]) -> int:
    shown = problems[:MAX_PROBLEMS_SHOWN]
    if len(problems) > len(shown):
        shown.append(f"... and {len(problems) - len(shown)} more")
    for line in shown:
        print(f"scalerl score: error: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _check_line(obj: Any, ids: set[str], by_prompt: dict[str, str]) -> tuple[tuple[str, str, str] | None, list[str]]:
    """((prompt_id, completion, finish_reason) or None, what is wrong) for one decoded line."""
    if not isinstance(obj, dict):
        return None, ["expected a JSON object"]
    problems = []
    completion, finish = obj.get("completion"), obj.get("finish_reason", "stop")
    if not isinstance(completion, str):
        problems.append('"completion" must be a string')
    if finish not in FINISH_REASONS:
        problems.append(f'"finish_reason" must be one of {", ".join(FINISH_REASONS)}, got {finish!r}')
    pid = None
    if ("prompt_id" in obj) == ("prompt" in obj):
        problems.append('give exactly one of "prompt_id" (a problem id of the task) or "prompt"')
    elif "prompt_id" in obj:
        pid = obj["prompt_id"] if obj["prompt_id"] in ids else None
        if pid is None:
            problems.append(f'"prompt_id" {obj["prompt_id"]!r} is not a problem of the task (train or eval split)')
    else:
        pid = by_prompt.get(obj["prompt"]) if isinstance(obj["prompt"], str) else None
        if pid is None:
            problems.append('"prompt" is not the prompt of any problem of the task')
    if problems or pid is None or not isinstance(completion, str):
        return None, problems
    return (str(pid), completion, str(finish)), []


def read_requests(path: Path, ids: set[str], by_prompt: dict[str, str]) -> tuple[list[tuple[int, str, str, str]],
                                                                                  list[str]]:
    """((line, prompt_id, completion, finish_reason) per line, problems as FILE:LINE: what), every line checked."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"{path}: cannot read: {exc}"]
    requests, problems = [], []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{n}: not JSON ({exc.msg} at column {exc.colno})")
            continue
        request, wrong = _check_line(obj, ids, by_prompt)
        problems += [f"{path}:{n}: {w}" for w in wrong]
        if request is not None:
            requests.append((n, *request))
    if not requests and not problems:
        problems.append(f"{path}: no completions")
    return requests, problems


def cmd_score(args: argparse.Namespace) -> int:
    from scalerl.config import SpecError, load_spec
    from scalerl.runtime.preflight import task_problems

    problems: list[str] = []
    spec = None
    try:
        spec = load_spec(args.spec, args.set)
        problems += task_problems(spec)  # only the task's: no model is loaded to grade
    except SpecError as exc:
        problems += str(exc).splitlines()
    if args.out is not None and (problem := output_file_problem("--out", args.out)):
        problems.append(problem)
    if not args.completions.is_file():
        problems.append(f"{args.completions}: no such file")
    if problems or spec is None:
        return _fail(problems)

    from scalerl.tasks.registry import task_from_config  # (not scalerl.parts: grading needs no torch)
    from scalerl.verifier.verifier import Verifier

    task = task_from_config(spec.task)
    answers: dict[str, str] = {}
    by_prompt: dict[str, str] = {}
    for split in ("train", "eval"):
        for pr in task.problems(split):
            answers.setdefault(pr.id, pr.answer)
            by_prompt.setdefault(pr.prompt, pr.id)
    requests, problems = read_requests(args.completions, set(answers), by_prompt)
    if problems:
        return _fail(problems)
    verifier = Verifier.from_spec(spec, task)

    def grade(req: tuple[int, str, str, str]) -> dict[str, Any]:
        n, pid, completion, finish = req
        t0 = time.perf_counter()
        g = verifier.grade(completion, answers[pid], finish)
        row: dict[str, Any] = {"line": n, "prompt_id": pid,
                               "reward": verifier.reward_correct if g.correct else verifier.reward_incorrect,
                               "correct": g.correct, "verdict": g.verdict,
                               "seconds": round(time.perf_counter() - t0, 4)}
        row.update(g.metrics or {})
        if g.detail:
            row["detail"] = g.detail
        return row

    out = args.out.open("w", encoding="utf-8") if args.out else sys.stdout
    verdicts: Counter[str] = Counter()
    seconds, correct = 0.0, 0
    with ThreadPoolExecutor(max(1, task.concurrent_grading)) as pool:
        for row in pool.map(grade, requests):  # in input order
            verdicts[row["verdict"]] += 1
            seconds += row["seconds"]
            correct += int(row["correct"])
            print(json.dumps(row), file=out, flush=True)
    if args.out:
        out.close()
    total = sum(verdicts.values())
    print(f"scalerl score: {total} completions graded, {correct} correct ({correct / total:.1%}); verdicts: "
          + ", ".join(f"{v} {c}" for v, c in verdicts.most_common())
          + f"; {seconds / total:.3f} s each on average (wall-clock time of grading one)", file=sys.stderr)
    return 0
