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
"""

from __future__ import annotations

import random
from typing import Any

import torch

from scalerl.generator.engine import GenerationEngine, LengthControl, PolicySource, SamplingParams
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
            result.append((ids, lps, o.finish_reason == "stop"))
        return result

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                 *, policy_source: PolicySource | None = None) -> list[Completion]:
        self._poll(policy_source)
        phrase = list(length.interruption_ids or ())
        if phrase:
            cuts = [self.rng.randint(*length.window) for _ in prompt_ids]
        else:
            cuts = [length.thinking_budget + length.answer_budget] * len(prompt_ids)
        first = self._sample(prompt_ids, sampling, cuts, [length.eos_id])
        v1 = self.version
        rows: list[dict[str, Any]] = []
        for ids, lps, stopped in first:
            closed = length.think_close_id in ids
            rows.append({"ids": ids, "lps": lps, "vers": [v1] * len(ids), "mask": [True] * len(ids),
                         "stopped": stopped, "closed": closed, "interrupted": False})
        need = [i for i, r in enumerate(rows) if phrase and not r["stopped"] and not r["closed"]]
        if need:
            self._poll(policy_source)
            cont = self._sample([prompt_ids[i] + rows[i]["ids"] + phrase for i in need], sampling,
                                [length.answer_budget] * len(need), [length.eos_id])
            for i, (ids, lps, stopped) in zip(need, cont, strict=True):
                r = rows[i]
                r["ids"] += phrase + ids
                r["lps"] += [0.0] * len(phrase) + lps
                r["vers"] += [self.version] * (len(phrase) + len(ids))
                r["mask"] += [False] * len(phrase) + [True] * len(ids)
                r.update(stopped=stopped, closed=True, interrupted=True)
        return [self._finish(r, length) for r in rows]

    def _finish(self, r: dict[str, Any], length: LengthControl) -> Completion:
        ids = r["ids"]
        think = ids.index(length.think_close_id) + 1 if length.think_close_id in ids else len(ids)
        truncated = not r["stopped"]
        if len(ids) - think > length.answer_budget:  # phase 1 ran past the answer budget
            keep = think + length.answer_budget
            for key in ("ids", "lps", "vers", "mask"):
                r[key] = r[key][:keep]
            truncated = True
        reason: FinishReason = "length" if truncated else ("interrupted" if r["interrupted"] else "stop")
        return Completion(token_ids=r["ids"], logprobs=r["lps"], versions=r["vers"], loss_mask=r["mask"],
                          finish_reason=reason, text=self.completion_text(r["ids"], length.eos_id),
                          thinking_tokens=think)

    def _poll(self, policy_source: PolicySource | None) -> None:
        if policy_source is not None:
            update = policy_source()
            if update is not None and update[0] > self.version:
                self.load_weights(update[1], update[0])
