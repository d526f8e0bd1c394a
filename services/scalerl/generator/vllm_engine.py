"""vLLM engine behind the `GenerationEngine` interface (GPU clusters; `pip install scalerl[vllm]`).

UNVERIFIED HERE: no machine this project runs on has vLLM and a GPU together. This module is written
against vLLM's documented offline API (`vllm.LLM`, `SamplingParams(logprobs=0)`, token prompts) and
is imported lazily, so nothing else depends on it.

How it maps our contract onto vLLM:
1. Per-token log-probs: `SamplingParams(logprobs=0)` returns the sampled token's log-prob. vLLM
   computes it from its own LM head; the FP32-head fix on the vLLM side needs a model patch that is
   not applied here (README: known gap), so the learner sees |log ρ| > 0 at step 0 in bf16.
2. Forced interruption: phase 1 samples up to each sequence's cut point; sequences that reached it
   without `</think>` or EOS get the phrase appended (loss-masked) and a phase-2 request of
   `answer_budget` tokens continues from prompt + completion + phrase.
3. Weight updates are applied between `generate` calls and between the two phases (not between
   decode steps inside one call): tokens carry the version that produced them.
4. Budget forcing (`engine.budget_forcing`): the maximum needs nothing new (an interruption whose
   phrase is `</think>` + answer prefix, at a fixed cut). The minimum cannot act inside one vLLM
   request, so `</think>` becomes a stop token of phase 1: a row that stops on it too early gets the
   "Wait" tokens appended (loss-masked) and is resubmitted, at most `max_waits` rounds; a row that
   stops on it legitimately continues into the answer phase. `stop_ids` are passed as stop tokens.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from scalerl.generator.engine import GenerationEngine, LengthControl, PolicySource, SamplingParams, close_end
from scalerl.messages import Completion, FinishReason


class VLLMEngine(GenerationEngine):
    def __init__(self, model_path: str, tokenizer: Any, *, seed: int = 0, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.85, version: int = 0) -> None:
        from vllm import LLM  # lazy: optional dependency, GPU only

        self.llm = LLM(model=model_path, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                       enable_prefix_caching=True)
        self.tokenizer = tokenizer
        self.version = version
        self.rng = random.Random(seed)

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        weights = list(state_dict.items())

        def _load(worker: Any) -> None:
            worker.model_runner.model.load_weights(weights=weights)

        self.llm.collective_rpc(_load)
        self.llm.reset_prefix_cache()  # cached prefixes were computed under the old weights
        self.version = version

    def _sample(self, prompts: list[list[int]], sampling: SamplingParams, max_tokens: list[int],
                stop_ids: list[int]) -> list[tuple[list[int], list[float], bool]]:
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        params = [VSampling(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=max(1, m),
                            logprobs=0, stop_token_ids=stop_ids, seed=self.rng.randrange(1 << 31))
                  for m in max_tokens]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        result = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [float(next(iter(d.values())).logprob) if d else 0.0 for d in (o.logprobs or [])]
            # A stop token id is reported in `stop_reason`; make sure it ends the ids (special tokens
            # may be left out of the output), with log-prob 0 when vLLM did not report one.
            if o.finish_reason == "stop" and isinstance(o.stop_reason, int) and (not ids or ids[-1] != o.stop_reason):
                ids.append(int(o.stop_reason))
                lps.append(0.0)
            result.append((ids, lps, o.finish_reason == "stop"))
        return result

    def _think_with_waits(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                          cuts: list[int]) -> list[tuple[list[int], list[float], list[bool], bool]]:
        """Phase 1 under budget forcing's minimum: rounds of sampling that stop on `</think>`; an early
        one is replaced by the "Wait" tokens (masked). Returns (ids, logprobs, loss mask, stopped) per row;
        `stopped` is True for EOS / stop ids, and for an accepted `</think>` the ids end with it."""
        if len(length.think_close_ids) != 1:
            raise ValueError("budget forcing's minimum on vLLM needs a one-token </think> (vLLM stops on single "
                             "token ids); use generation.engine 'torch' with this tokenizer")
        close, wait = length.think_close_ids[0], list(length.wait_ids)
        rows: list[tuple[list[int], list[float], list[bool], bool]] = [([], [], [], False) for _ in prompt_ids]
        waits = [0] * len(prompt_ids)
        active = list(range(len(prompt_ids)))
        stop_ids = [*length.all_end_ids, close, *length.stop_ids]
        while active:
            left = [cuts[i] - len(rows[i][0]) for i in active]
            outs = self._sample([prompt_ids[i] + rows[i][0] for i in active], sampling, left, stop_ids)
            again = []
            for i, (ids, lps, stopped) in zip(active, outs, strict=True):
                r_ids, r_lps, r_mask, _ = rows[i]
                early = (stopped and ids and ids[-1] == close and len(r_ids) + len(ids) - 1 < length.min_thinking
                         and waits[i] < length.max_waits)
                if early:
                    ids, lps = ids[:-1], lps[:-1]
                r_ids += ids
                r_lps += lps
                r_mask += [True] * len(ids)
                if early:
                    r_ids += wait
                    r_lps += [0.0] * len(wait)
                    r_mask += [False] * len(wait)
                    waits[i] += 1
                    if len(r_ids) < cuts[i]:
                        again.append(i)
                        continue
                rows[i] = (r_ids, r_lps, r_mask, stopped and not early and bool(ids) and ids[-1] != close)
            active = again
        return rows

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                 *, policy_source: PolicySource | None = None) -> list[Completion]:
        self._poll(policy_source)
        phrase = list(length.interruption_ids or ())
        if phrase:
            cuts = [self.rng.randint(*length.window) for _ in prompt_ids]
        else:
            cuts = [length.thinking_budget + length.answer_budget] * len(prompt_ids)
        if length.forces_minimum:
            first = self._think_with_waits(prompt_ids, sampling, length, cuts)
        else:
            first = [(ids, lps, [True] * len(ids), stopped)
                     for ids, lps, stopped in self._sample(prompt_ids, sampling, cuts,
                                                           [*length.all_end_ids, *length.stop_ids])]
        v1 = self.version
        rows: list[dict[str, Any]] = []
        for ids, lps, mask, stopped in first:
            closed = close_end(ids, length) is not None
            rows.append({"ids": ids, "lps": lps, "vers": [v1] * len(ids), "mask": mask,
                         "stopped": stopped, "closed": closed, "interrupted": False})
        if length.forces_minimum:  # rows that closed thinking stopped there: sample their answers
            self._answer_after_close(prompt_ids, rows, sampling, length)
        need = [i for i, r in enumerate(rows) if phrase and not r["stopped"] and not r["closed"]]
        if need:
            self._poll(policy_source)
            cont = self._sample([prompt_ids[i] + rows[i]["ids"] + phrase for i in need], sampling,
                                [length.answer_budget] * len(need), list(length.all_end_ids))
            for i, (ids, lps, stopped) in zip(need, cont, strict=True):
                r = rows[i]
                r["ids"] += phrase + ids
                r["lps"] += [0.0] * len(phrase) + lps
                r["vers"] += [self.version] * (len(phrase) + len(ids))
                r["mask"] += [False] * len(phrase) + [True] * len(ids)
                r.update(stopped=stopped, closed=True, interrupted=True)
        return [self._finish(r, length) for r in rows]

    def _answer_after_close(self, prompt_ids: list[list[int]], rows: list[dict[str, Any]],
                            sampling: SamplingParams, length: LengthControl) -> None:
        todo = [i for i, r in enumerate(rows) if r["closed"] and not r["stopped"]]
        if not todo:
            return
        outs = self._sample([prompt_ids[i] + rows[i]["ids"] for i in todo], sampling,
                            [length.answer_budget] * len(todo), list(length.all_end_ids))
        for i, (ids, lps, stopped) in zip(todo, outs, strict=True):
            r = rows[i]
            r["ids"] += ids
            r["lps"] += lps
            r["vers"] += [self.version] * len(ids)
            r["mask"] += [True] * len(ids)
            r["stopped"] = stopped

    def _finish(self, r: dict[str, Any], length: LengthControl) -> Completion:
        ids = r["ids"]
        end = close_end(ids, length)
        think = len(ids) if end is None else end
        truncated = not r["stopped"]
        if len(ids) - think > length.answer_budget:  # phase 1 ran past the answer budget
            keep = think + length.answer_budget
            for key in ("ids", "lps", "vers", "mask"):
                r[key] = r[key][:keep]
            truncated = True
        reason: FinishReason = "length" if truncated else ("interrupted" if r["interrupted"] else "stop")
        return Completion(token_ids=r["ids"], logprobs=r["lps"], versions=r["vers"], loss_mask=r["mask"],
                          finish_reason=reason, text=self.completion_text(r["ids"], length.all_end_ids),
                          thinking_tokens=think)

    def _poll(self, policy_source: PolicySource | None) -> None:
        if policy_source is not None:
            update = policy_source()
            if update is not None and update[0] > self.version:
                self.load_weights(update[1], update[0])
