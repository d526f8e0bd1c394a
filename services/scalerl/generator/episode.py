"""Multi-turn rollouts: model turns and tool observations in one sequence.

`EpisodeRunner.generate` has the engine's signature and returns one `Completion` per prompt, as the
engine does, so the generator role, the held-out evaluation and the learner take an episode where they
took a single turn:

1. Every row generates a turn (`GenerationEngine.generate` with `</tool>`'s spellings as stop sequences).
2. A row whose turn ended on `</tool>` gets the call's observation (`Tools.execute`, up to `Tools.workers`
   calls side by side, in this process's sandbox or, with `environment.service`, by the environment
   service), tokenized as `<result>\\n...\\n</result>\\n` and cut to `max_observation_tokens`.
3. Rows whose observation is in generate their next turn from prompt + everything so far, until no row
   calls a tool, a row has made `max_turns` calls, or its positions run out.

A row does not wait for the slowest call of its turn. Once one call is answered, the runner waits for
the others as long again as that call took (at least `straggler_s`, 0.5 s by default), then starts the
next turn for every row whose observation is in. Rows whose calls are still running (a program that runs
into its time limit, a slow replica) join a later turn, together with whatever else is in by then. Calls
of similar cost so stay in one batch, and an outlier holds up only its own row.

The completion's tokens are the turns and observations in order. Model tokens keep their sampling
log-prob and the policy version that sampled them (weights swapped in flight, within a turn or between
turns, are stamped token by token by the engine); observation tokens have loss mask False, log-prob 0
(never read: the learner and every metric take masked tokens out) and the version of the token before
them.

Length rules apply per episode: the thinking tokens of all turns count against one thinking budget and
one cut point, drawn once per episode at its first turn (`Resume`); observation tokens are not thinking.
The answer phase (after `</think>`, or after the interruption phrase at the cut) takes no tool calls.
Finish reason: the last turn's; "length" when the episode ends on a call it may not make (its `max_turns`
used, or no positions left for the observation and another turn).
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from scalerl.config import JobSpec
from scalerl.environment.tools import (
    RESULT_CLOSE,
    RESULT_OPEN,
    TOOL_CLOSE,
    Toolbox,
    ToolCall,
    Tools,
    parse_call,
    tool_limits,
)
from scalerl.generator.engine import (
    GenerationEngine,
    LengthControl,
    PolicySource,
    Resume,
    SamplingParams,
    ends_with_any,
)
from scalerl.messages import Completion, FinishReason
from scalerl.model.text import tag_spellings, text_ids

MIN_TURN_ROOM = 8
"""Positions a row must have left after an observation to be given another turn (tokens)."""
STRAGGLER_S = 0.5
"""The least time (s) the runner waits for the other calls once the first is answered."""


@dataclass
class _Episode:
    prompt: list[int]
    cut: int
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vers: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    thinking: int = 0
    calls: int = 0
    finish: FinishReason = "stop"
    turn_start: int = 0  # where the last turn's tokens start in `ids`
    called_at: float = 0.0  # when its pending call was sent (time.monotonic)

    def add(self, c: Completion) -> None:
        self.turn_start = len(self.ids)
        self.ids += c.token_ids
        self.lps += c.logprobs
        self.vers += c.versions
        self.mask += c.loss_mask
        self.thinking = c.thinking_tokens
        self.finish = c.finish_reason

    def observe(self, tokens: list[int], version: int) -> None:
        self.ids += tokens
        self.lps += [0.0] * len(tokens)
        self.vers += [self.vers[-1] if self.vers else version] * len(tokens)
        self.mask += [False] * len(tokens)
        self.calls += 1


class ObservationTokens:
    """A tool's answer as the tokens an episode holds: `<result>\\n...\\n</result>\\n`, its content cut (and
    marked `[cut]`) so the whole fits `max_tokens` and the room the sequence has left. The episode runner
    and SFT on tool demonstrations (`scalerl.learner.sft.encode_demonstration`) both use it, so a
    demonstration holds exactly the observation tokens an episode would."""

    def __init__(self, tokenizer: Any, max_tokens: int) -> None:
        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self._open = list(text_ids(tokenizer, RESULT_OPEN))
        self._close = list(text_ids(tokenizer, RESULT_CLOSE))
        self.frame = len(self._open) + len(self._close)
        """Tokens of `<result>` and `</result>` alone."""
        if self.frame >= max_tokens:
            raise ValueError(f"max_observation_tokens: {max_tokens} leaves no room inside "
                             f"<result>...</result> ({self.frame} tokens)")
        self._marker = list(text_ids(tokenizer, "\n[cut]"))  # ends an observation whose content was cut

    def __call__(self, text: str, room: int | None = None) -> list[int]:
        """`text` as observation tokens, fitting `min(room, max_tokens)` (`max_tokens` when room is None)."""
        keep = min(self.max_tokens if room is None else room, self.max_tokens) - self.frame
        content = list(text_ids(self.tokenizer, text)) if text else []
        if len(content) > keep:
            content = content[:max(0, keep - len(self._marker))] + self._marker[:keep]
        return [*self._open, *content, *self._close]


class EpisodeRunner:
    """Generates episodes of up to `max_turns` tool calls with `engine`; `calls` counts the tool calls
    answered so far."""

    def __init__(self, engine: GenerationEngine, tokenizer: Any, tools: Tools, *, max_turns: int,
                 max_observation_tokens: int, seed: int = 0, straggler_s: float = STRAGGLER_S) -> None:
        if max_turns < 1 or max_observation_tokens < 1 or straggler_s < 0:
            raise ValueError(f"need max_turns >= 1, max_observation_tokens >= 1 and straggler_s >= 0, got "
                             f"{max_turns}, {max_observation_tokens}, {straggler_s}")
        self.straggler_s = straggler_s
        self.engine = engine
        self.tokenizer = tokenizer
        self.tools = tools
        self.max_turns = max_turns
        self.max_observation_tokens = max_observation_tokens
        self.stop_sequences = tag_spellings(tokenizer, TOOL_CLOSE)
        self.observation = ObservationTokens(tokenizer, max_observation_tokens)
        self.rng = torch.Generator().manual_seed(seed)
        self.calls = 0

    def prompt(self, text: str) -> str:
        """A task's prompt with the tools' instructions appended (what the model is conditioned on)."""
        return text + self.tools.instructions()

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                 *, policy_source: PolicySource | None = None) -> list[Completion]:
        rules = replace(length, stop_sequences=(*length.stop_sequences, *self.stop_sequences))
        lo, hi = length.window
        cuts = torch.randint(lo, hi + 1, (len(prompt_ids),), generator=self.rng).tolist()
        if not length.interruption_ids:
            cuts = [length.thinking_budget] * len(prompt_ids)
        episodes = [_Episode(prompt=list(p), cut=c) for p, c in zip(prompt_ids, cuts, strict=True)]
        ready = episodes
        pending: dict[Future[str], _Episode] = {}
        room = self.engine.max_positions
        with ThreadPoolExecutor(max_workers=max(1, self.tools.workers), thread_name_prefix="tool") as pool:
            while ready or pending:
                if not ready:
                    ready = self._answered(pending, room)
                turns = self.engine.generate([e.prompt + e.ids for e in ready], sampling, rules,
                                             policy_source=policy_source,
                                             resume=[Resume(e.thinking, e.cut) for e in ready])
                for e, c in zip(ready, turns, strict=True):
                    e.add(c)
                    if c.finish_reason == "stop" and ends_with_any(c.token_ids, self.stop_sequences):
                        left = room - len(e.prompt) - len(e.ids)
                        if e.calls < self.max_turns and left >= self.observation.frame + MIN_TURN_ROOM:
                            e.called_at = time.monotonic()
                            call = parse_call(self.engine.decode(e.ids[e.turn_start:]))
                            pending[pool.submit(self._run, call)] = e
                        else:
                            e.finish = "length"  # a call it may not make
                ready = []
        return [Completion(token_ids=e.ids, logprobs=e.lps, versions=e.vers, loss_mask=e.mask, finish_reason=e.finish,
                           text=self.engine.completion_text(e.ids, length.all_end_ids), thinking_tokens=e.thinking)
                for e in episodes]

    def _run(self, call: ToolCall | None) -> str:
        return self.tools.execute(call).text

    def _answered(self, pending: dict[Future[str], _Episode], room: int) -> list[_Episode]:
        """The rows whose observations are in, each observed, once at least one is: after the first, the
        others get as long again as that call took (at least `straggler_s`). Removes them from `pending`."""
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        first = min(done, key=lambda f: pending[f].called_at)
        took = time.monotonic() - pending[first].called_at
        if len(done) < len(pending):
            done, _ = wait(pending, timeout=max(self.straggler_s, took))
        out = []
        for f, e in list(pending.items()):  # in the order the calls were sent
            if f in done:
                del pending[f]
                obs = self.observation(f.result(), room - len(e.prompt) - len(e.ids) - MIN_TURN_ROOM)
                e.observe(obs, self.engine.version)
                self.calls += 1
                out.append(e)
        return out


def episode_runner(spec: JobSpec, engine: GenerationEngine, tokenizer: Any) -> EpisodeRunner | None:
    """The job's episode runner (`environment`), or None when it has no tools (single-turn completions)."""
    env = spec.environment
    if not env.tools:
        return None
    limits = tool_limits(env.tool_wall_s, env.tool_memory_mb)
    tools: Tools
    if env.service:  # the calls go to the environment service (the verifiers), retried across its replicas
        from scalerl.environment.remote import RemoteToolbox
        from scalerl.rpc.security import RpcSecurity

        tools = RemoteToolbox(tuple(env.tools), env.service, security=RpcSecurity.from_env(), limits=limits)
    else:
        tools = Toolbox(tuple(env.tools), limits)
    return EpisodeRunner(engine, tokenizer, tools, max_turns=env.max_turns,
                         max_observation_tokens=env.max_observation_tokens, seed=spec.seed)
