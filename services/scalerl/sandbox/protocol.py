"""What the service side (runner.py) and the launcher (launcher.py) agree on: the launcher's arguments, the
lines it writes on its status pipe, and the exit codes its Python mode gives the verdicts that a plain exit
code cannot carry.

The launcher imports this module under `python -I -S` before any user code runs, so it stays stdlib-only
and cheap: no json, enum, dataclasses or typing (each of those costs milliseconds at every execution).

Status lines (one `os.write` each, below PIPE_BUF, so lines from the launcher, the namespace's init and
the worker never interleave):

    layer <name> <0|1> <detail>      a layer the launcher or the worker set up (1) or could not (0)
    exit <wait status> <maxrss KiB>  the worker's wait status, from whichever process reaped it
    stopped                          the launcher was told to stop (SIGTERM) and killed everything
    cpu <seconds>                    user + system CPU of everything the launcher reaped (last line)
    fail <message>                   the sandbox could not be set up: nothing of the user's ran
"""

from __future__ import annotations

# Exit codes of the Python mode's wrapper (launcher._run_source), chosen far from the ones programs use.
EXIT_MEMORY = 241  # MemoryError, or an OSError with ENOMEM, reached the top level
EXIT_FORBIDDEN = 242  # PermissionError (EPERM/EACCES from Landlock, seccomp, DAC) reached the top level
EXIT_FILE_SIZE = 243  # OSError EFBIG (RLIMIT_FSIZE; Python ignores SIGXFSZ) reached the top level
EXIT_SETUP = 244  # the worker could not set itself up (a `fail` line says why)
EXIT_EXEC = 127  # exec mode: the program could not be executed (not found, not a program)

# Root on the host: each execution runs as a uid of its own, SANDBOX_UID_BASE + the launcher's pid (unique
# among live launchers), so RLIMIT_NPROC counts only its processes and no two executions share a uid.
SANDBOX_UID_BASE = 1 << 30

MODES = ("python", "exec")


def encode_args(options: dict[str, str], argv: list[str]) -> list[str]:
    """The launcher's command-line arguments: `key=value` options, then `--` and the program's argv."""
    for key, value in options.items():
        if "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"bad launcher option {key!r}={value!r}")
    return [f"{k}={v}" for k, v in options.items()] + ["--", *argv]


def decode_args(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """The inverse of `encode_args`."""
    split = args.index("--")
    options = dict(a.split("=", 1) for a in args[:split])
    return options, args[split + 1 :]


def status_line(*fields: object) -> bytes:
    """One status line; the last field may contain spaces, none may contain a newline."""
    text = " ".join(str(f).replace("\n", " ") for f in fields)
    return (text[:3000] + "\n").encode("utf-8", "replace")
