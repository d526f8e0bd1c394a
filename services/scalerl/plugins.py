"""Tasks from other packages: the `scalerl.tasks` entry-point group.

A distribution registers a task under a name in its `pyproject.toml`:

    [project.entry-points."scalerl.tasks"]
    reverse = "scalerl_reverse:ReverseTask"

and a job spec selects it with `task.kind: reverse`, its own settings under `task.options`.
docs/guides/own-task.md is the guide; examples/plugin/ the worked example.

The contract of the object an entry point names (a `Task` subclass or any other callable):

1. Called with keyword arguments only: `seed` (the spec's `task.data_seed`), `train_size`,
   `eval_size`, `phrasing` ("symbolic" or "chat") and `options`; it returns a `scalerl.tasks.Task`.
2. `options` is an instance of the callable's `Options` attribute, a pydantic model, when it has one:
   `task.options` is validated by that model when the spec is loaded, each problem named
   `task.options.<field>`. Without an `Options` model the task takes no options and a non-empty
   `task.options` is refused (no setting is accepted and then ignored).
3. A `ValueError` raised while building (an unsupported phrasing, say) refuses the spec before
   anything runs, as a bad value in the YAML is.
4. The task's `has_solutions` property says whether its training problems carry gold solutions for
   SFT (`Task.has_solutions`: by default it generates the training split and looks; a task overrides
   it when it knows). A spec asking for SFT of a task without them is refused when it is checked
   (`runtime/preflight.py`), as one of a JSONL task is.

Choices:

1. Lazy: listing the names reads installed distributions' metadata only, and only when a spec names
   a kind that is not built in; a plugin's module is imported when a spec names it (to validate its
   options) and when the task is built. Keep the module that defines the callable and its `Options`
   free of heavy imports (torch), so a bad spec is still refused at once.
2. Built-in kinds win: a plugin registering "addition" is never loaded. Two distributions
   registering one name is an error naming both, not a silent pick.
3. Every role that builds the task (the embedded run; the generator, verifier and learner processes
   or pods of a distributed job; the operator, which validates the spec) needs the plugin installed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from pydantic import BaseModel, ValidationError

TASK_GROUP = "scalerl.tasks"


class PluginError(ValueError):
    """A plugin task that cannot be used; the message is one line naming the plugin."""


def _entry_points(builtin: tuple[str, ...]) -> dict[str, list[metadata.EntryPoint]]:
    found: dict[str, list[metadata.EntryPoint]] = {}
    for ep in metadata.entry_points(group=TASK_GROUP):
        if ep.name not in builtin:
            found.setdefault(ep.name, []).append(ep)
    return found


def task_plugin_names(builtin: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Names of the installed plugin tasks, sorted, leaving out those in `builtin`."""
    return tuple(sorted(_entry_points(builtin)))


def _distribution(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "?"


def load_task_plugin(name: str, builtin: tuple[str, ...] = ()) -> Callable[..., Any]:
    """The callable registered as task `name`; raises PluginError (unknown, ambiguous, not importable)."""
    found = _entry_points(builtin)
    eps = found.get(name)
    if not eps:
        installed = ", ".join(sorted(found)) or "none installed"
        raise PluginError(f"unknown task kind; allowed: {', '.join(builtin)} (built in), or a plugin task "
                          f"({installed}; entry-point group {TASK_GROUP})")
    if len({ep.value for ep in eps}) > 1:
        where = ", ".join(f"{ep.value} ({_distribution(ep)})" for ep in eps)
        raise PluginError(f"plugin task {name!r} is registered twice: {where}; uninstall one")
    try:
        factory = eps[0].load()
    except Exception as exc:  # a plugin's import may fail in any way; say which plugin and why
        raise PluginError(f"plugin task {name!r} ({eps[0].value}) cannot be loaded: "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise PluginError(f"plugin task {name!r} ({eps[0].value}) is a {type(factory).__name__}, not a callable "
                          "that builds a Task")
    return factory  # type: ignore[no-any-return]


def options_model(factory: Callable[..., Any]) -> type[BaseModel] | None:
    """The plugin's `Options` pydantic model, or None when it declares none."""
    model = getattr(factory, "Options", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def options_problems(exc: ValidationError) -> str:
    """The problems of a plugin's `Options` validation on one line, each named by its field."""
    parts = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        shown = "" if err["type"] in ("extra_forbidden", "missing") else f" (got {err.get('input')!r})"
        parts.append(f"options.{path}: {msg}{shown}" if path else f"options: {msg}{shown}")
    return "; ".join(parts)


def check_options(name: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> BaseModel | None:
    """`options` validated by the plugin's `Options` model (None when it has none and `options` is empty).

    Raises the model's `ValidationError` as it is (inside a pydantic validator its problems keep their
    own paths: `task.options.length`), and PluginError for options given to a task that takes none.
    """
    model = options_model(factory)
    if model is None:
        if options:
            raise PluginError(f"plugin task {name!r} takes no options (it declares no Options model); "
                              f"got {sorted(options)}")
        return None
    return model.model_validate(dict(options))


def check_task_options(kind: str, options: Mapping[str, Any], builtin: tuple[str, ...]) -> BaseModel | None:
    """`task.options` checked for task `kind`: empty for a built-in kind, else by the plugin's model."""
    if kind in builtin:
        if options:
            raise PluginError(f"only plugin tasks take options; task.kind {kind!r} is built in (set its task.* "
                              "fields)")
        return None
    return check_options(kind, load_task_plugin(kind, builtin), options)
