"""How a job spec's problems are worded: one line per problem, naming its dotted path and what is allowed.

`JobSpec` validation (config.py) reports every problem of a spec at once, so a user fixes a file in one
pass instead of one rerun per typo:

    trian: unknown field (did you mean 'train'?); allowed: name, seed, model, task, ...
    train.prompts_per_step: Input should be a valid integer, unable to parse string as an integer (got 'many')
    optim.lr: Input should be greater than 0 (got -1)

Pure wording: no file system, no environment; `config.py` calls these with its own model class.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

_TAB_HINT = "YAML indents with spaces, not tabs"


def _section_fields(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The field names of the section at `loc` (a tuple of keys from `root`), or None if it is not one."""
    model: Any = root
    for key in loc:
        field = model.model_fields.get(key) if isinstance(key, str) else None
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    return list(model.model_fields)


def _problem_line(root: type[BaseModel], e: Any) -> str:
    loc = tuple(e["loc"])
    path = ".".join(str(p) for p in loc) or "<root>"
    msg = str(e["msg"]).removeprefix("Value error, ")
    if e["type"] == "value_error" and not loc:  # a check across sections names its own fields
        return msg
    if e["type"] == "extra_forbidden":
        allowed = _section_fields(root, loc[:-1]) or []
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{path}: unknown field{hint}; allowed: {', '.join(allowed)}" if allowed else f"{path}: unknown field"
    value = e.get("input")
    shown = "" if e["type"] == "missing" or isinstance(value, dict) else f" (got {value!r})"
    return f"{path}: {msg}{shown}"


def format_validation_error(root: type[BaseModel], err: ValidationError) -> str:
    """Every problem of `err` (raised validating `root`), one line each, in the order of the fields."""
    return "\n".join(dict.fromkeys(_problem_line(root, e) for e in err.errors()))


def yaml_error_line(path: Path, exc: yaml.YAMLError) -> str:
    """`path:LINE:COLUMN: not valid YAML: <reason>` (1-based), one line, for a file PyYAML cannot parse."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    reason = str(getattr(exc, "problem", None) or exc).replace("\n", " ")
    if "'\\t'" in reason:
        reason += f" ({_TAB_HINT})"
    return f"{where}: not valid YAML: {reason}"


def empty_spec_line(path: Path) -> str:
    """Why an empty spec file is refused, and what a minimal one looks like."""
    return (f"{path}: the job spec is empty, and with every field at its ScaleRL default it would start a "
            "paper-scale run; give at least the job's name and task (e.g. `name: my-run` and "
            "`task: {kind: addition, digits: 2}`), or start from a copy of examples/quickstart.yaml")
