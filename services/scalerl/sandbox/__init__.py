"""A sandbox for model-written code: `run_python(source)` / `run(argv)` in a fresh process per execution,
with limits (wall, CPU, memory, file size, processes, output, open files) and the isolation layers the
host allows (user/pid/network/mount namespaces, a uid of its own when the service is root, Landlock,
seccomp, no capabilities, an empty environment). `isolation()` says which layers this host gives.
docs/guides/sandbox.md describes the layers, what each stops and what remains inside a Pod.

The launcher side (launcher.py, linux.py, landlock.py, seccomp.py, protocol.py) is stdlib-only: it runs
under `python -I -S` before the code, without this package's __init__.
"""

from scalerl.sandbox.model import Execution, Layer, Limits, SandboxError, Verdict
from scalerl.sandbox.runner import interpreter, isolation, run, run_python

__all__ = ["Execution", "Layer", "Limits", "SandboxError", "Verdict", "interpreter", "isolation", "run", "run_python"]
