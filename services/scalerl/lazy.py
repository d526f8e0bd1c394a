"""Lazy package exports (PEP 562), so that `scalerl --help` does not import numpy, scipy or torch.

A package lists `{name: submodule}`; `lazy_exports(__name__, table)` returns the module `__getattr__`
that imports the submodule the first time one of its names is read. Type checkers see the real
imports, which the package keeps under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """`__getattr__` for `package`: `table` maps an exported name to the submodule (relative) defining it."""

    def module_getattr(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return module_getattr


def lazy_handler(module: str, name: str) -> Callable[[Any], int]:
    """A command handler that imports `module` (and its torch/numpy) only when the command runs."""

    def handler(args: Any) -> int:
        return int(getattr(importlib.import_module(module), name)(args))

    handler.__qualname__ = handler.__name__ = name
    return handler
