"""Batched sampling with a Hugging Face causal LM in plain torch (CPU or GPU).

Per decode step every live row gets exactly one token, either sampled or forced (the interruption
phrase). The loop keeps a KV cache (`DynamicCache`) across steps; a weight swap between steps copies
the new tensors into the parameters in place and leaves the cache as it is (PipelineRL: the cache
built under older weights is kept, ScaleRL §2.1).

Legend: B = rows (prompts × G), P = padded prompt length, V = vocabulary.

Departures / choices:
1. The recorded log-prob is that of the temperature-scaled full distribution; with top_p < 1 the
   sampler draws from the truncated one. The learner uses the same temperature, so with top_p = 1
   (the default) the ratio is exactly 1 at step 0.
2. Rows that finish keep being fed (their outputs are ignored) until every row is done, as
   `model.generate` does; no continuous batching.
3. Forced tokens (FORCED phase) come from one table with a row per phrase kind: the interruption
   phrase (training-time interruption, and budget forcing's maximum: `</think>` at a fixed cut) and the
   "Wait" phrase (budget forcing's minimum, started when a row samples `</think>` too early). Both
   are recorded with `loss_mask` False, so the learner never trains on them.
4. `</think>` may be several tokens (a BPE tokenizer without a special token for it): `CloseMatcher`
   keeps each row's last few tokens and reports the step whose token completes any spelling of it
   (the generated suffix equals the sequence); one token is the special case of a length-1 suffix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from scalerl.generator.engine import GenerationEngine, LengthControl, PolicySource, Resume, SamplingParams
from scalerl.messages import Completion, FinishReason
from scalerl.model.factory import lm_head_logits, trunk_of

# Row phases of the length controller.
THINKING, FORCED, ANSWER, DONE = 0, 1, 2, 3
# Kinds of forced phrase (row of the forced-token table): the interruption phrase, budget forcing's "Wait".
INTERRUPT, WAIT = 0, 1


class CloseMatcher:
    """Which rows' next token completes `</think>`: each row's previous K - 1 tokens are kept
    (K = the longest spelling), and a token closes when previous tokens + it end with a spelling."""

    def __init__(self, sequences: tuple[tuple[int, ...], ...], rows: int, device: torch.device) -> None:
        self.sequences = [torch.tensor(seq, dtype=torch.long, device=device) for seq in sequences]
        width = max(len(seq) for seq in sequences) - 1
        self.tail_BK = torch.full((rows, width), -1, dtype=torch.long, device=device)  # -1: no token yet

    def completes(self, tok_B: torch.Tensor) -> torch.Tensor:
        """[B] bool: the tail followed by `tok_B` ends with one of the sequences."""
        hit = torch.zeros_like(tok_B, dtype=torch.bool)
        K = self.tail_BK.shape[1]
        for seq in self.sequences:
            n = len(seq)
            ok = tok_B == seq[-1]
            if n > 1:
                ok &= (self.tail_BK[:, K - n + 1:] == seq[:-1]).all(-1)
            hit |= ok
        return hit

    def push(self, tok_B: torch.Tensor) -> None:
        if self.tail_BK.shape[1]:
            self.tail_BK = torch.cat([self.tail_BK[:, 1:], tok_B.unsqueeze(-1)], dim=1)


class TorchEngine(GenerationEngine):
    def __init__(self, model: Any, tokenizer: Any, *, fp32_head: bool = True, seed: int = 0,
                 version: int = 0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.fp32_head = fp32_head
        self.version = version
        self.device = next(model.parameters()).device
        self.rng = torch.Generator(device=self.device)
        self.rng.manual_seed(seed)
        self.swaps_in_flight = 0  # weight swaps that happened inside a generate() call

    # -- weights ---------------------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        missing = [k for k in params if k not in state_dict and not k.endswith("inv_freq")]
        if missing:
            raise KeyError(f"weights for version {version} lack {missing[:3]}...")
        for name, tensor in state_dict.items():
            if name in params:
                params[name].copy_(tensor)  # converts as it copies: no temporary of the tensor in the model's dtype
        self.version = version

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    # -- RNG state (exact resume) ------------------------------------------------------------------
    def rng_state(self) -> torch.Tensor:
        return self.rng.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.rng.set_state(state)

    def reseed(self, seed: int) -> None:
        """Restart the sampling stream from `seed` (what the constructor's `seed` does)."""
        self.rng.manual_seed(seed)

    # -- sampling ----------------------------------------------------------------------------------
    @staticmethod
    def _sampling_probs(logits_BV: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities the sampler draws from [B, V], temperature-scaled log-probs [B, V]): temperature,
        then the top-p nucleus (the token crossing top_p kept). Temperature 0 is the argmax (one-hot)."""
        if sampling.temperature == 0:
            probs_BV = torch.nn.functional.one_hot(logits_BV.argmax(-1), logits_BV.shape[-1]).float()
            return probs_BV, torch.log_softmax(logits_BV.float(), dim=-1)
        logp_BV = torch.log_softmax(logits_BV.float() / sampling.temperature, dim=-1)
        probs_BV = logp_BV.exp()
        if sampling.top_p < 1.0:
            sorted_p, order = probs_BV.sort(dim=-1, descending=True)
            outside = sorted_p.cumsum(-1) - sorted_p > sampling.top_p
            sorted_p = sorted_p.masked_fill(outside, 0.0)
            probs_BV = torch.zeros_like(probs_BV).scatter(-1, order, sorted_p)
        return probs_BV, logp_BV

    def _sample(self, logits_BV: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (sampled token [B], temperature-scaled log-probs [B, V]); temperature 0 = argmax."""
        if sampling.temperature == 0:
            return logits_BV.argmax(-1), torch.log_softmax(logits_BV.float(), dim=-1)
        probs_BV, logp_BV = self._sampling_probs(logits_BV, sampling)
        tok_B = torch.multinomial(probs_BV, 1, generator=self.rng).squeeze(-1)
        return tok_B, logp_BV

    @torch.no_grad()
    def next_token_probs(self, prefix_ids: list[list[int]], sampling: SamplingParams) -> torch.Tensor:
        """The distribution `generate` would draw each row's next token from, after the whole prefix
        (prompt + tokens so far): [B, V] float64 on the CPU, rows summing to 1 (top-p's excluded tokens
        are 0). One forward of every prefix, no cache: `evaluation.unique_search` keeps the tree and
        reports these prefixes as prefill."""
        ids_BP, mask_BP = self._left_pad(prefix_ids)
        out = trunk_of(self.model)(input_ids=ids_BP, attention_mask=mask_BP,
                                   position_ids=(mask_BP.cumsum(-1) - 1).clamp(min=0))
        logits_BV = lm_head_logits(self.model, out.last_hidden_state[:, -1], self.fp32_head)
        probs_BV = self._sampling_probs(logits_BV, sampling)[0].double()
        return (probs_BV / probs_BV.sum(-1, keepdim=True)).cpu()

    def _left_pad(self, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        pad = self.tokenizer.pad_token_id
        P = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), P), pad, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), P), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, P - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, length: LengthControl,
                 *, policy_source: PolicySource | None = None,
                 resume: Sequence[Resume] | None = None) -> list[Completion]:
        if not prompt_ids:
            return []
        if resume is not None and len(resume) != len(prompt_ids):
            raise ValueError(f"resume: {len(resume)} entries for {len(prompt_ids)} prompts")
        B = len(prompt_ids)
        dev = self.device
        ids_BP, mask_BP = self._left_pad(prompt_ids)
        max_pos = self.max_positions
        phrase_len = len(length.interruption_ids or ())
        wait_len = len(length.wait_ids) if length.forces_minimum else 0
        forced_table = self._forced_table(length, dev)  # [2, L]: interruption phrase, "Wait"
        stop_ids = torch.tensor(length.stop_ids, dtype=torch.long, device=dev) if length.stop_ids else None
        end_ids = torch.tensor(length.all_end_ids, dtype=torch.long, device=dev)
        closer = CloseMatcher(length.close_sequences, B, dev)
        stopper = CloseMatcher(length.stop_sequences, B, dev) if length.stop_sequences else None
        max_steps = length.thinking_budget + wait_len + phrase_len + length.answer_budget
        max_steps = min(max_steps, max_pos - ids_BP.shape[1])
        if max_steps <= 0:
            raise ValueError(f"prompt of {ids_BP.shape[1]} tokens leaves no room under {max_pos} positions")

        # Per-row controller state.
        phase = torch.full((B,), THINKING, dtype=torch.long, device=dev)
        n_think = torch.zeros(B, dtype=torch.long, device=dev)
        n_answer = torch.zeros(B, dtype=torch.long, device=dev)
        forced_pos = torch.zeros(B, dtype=torch.long, device=dev)
        forced_kind = torch.full((B,), INTERRUPT, dtype=torch.long, device=dev)
        n_waits = torch.zeros(B, dtype=torch.long, device=dev)
        interrupted = torch.zeros(B, dtype=torch.bool, device=dev)
        truncated = torch.zeros(B, dtype=torch.bool, device=dev)
        # Cut points are drawn under every length rule, so the sampling stream (and a paired comparison
        # of recipes from one checkpoint) does not depend on whether interruptions are on.
        lo, hi = length.window
        cut_at = torch.randint(lo, hi + 1, (B,), generator=self.rng, device=dev)
        if not length.interruption_ids:
            cut_at = torch.full((B,), length.thinking_budget, dtype=torch.long, device=dev)
        if resume is not None:
            cut_at = torch.tensor([r.cut for r in resume], dtype=torch.long, device=dev)
            n_think = torch.tensor([r.thinking_used for r in resume], dtype=torch.long, device=dev)

        steps_tok, steps_logp, steps_forced, steps_live, steps_version = [], [], [], [], []
        trunk = trunk_of(self.model)
        pos_B = mask_BP.sum(-1) - 1
        out = trunk(input_ids=ids_BP, attention_mask=mask_BP,
                    position_ids=(mask_BP.cumsum(-1) - 1).clamp(min=0), use_cache=True)
        cache, hidden_BH = out.past_key_values, out.last_hidden_state[:, -1]
        attn = mask_BP
        for _ in range(max_steps):
            live_B = phase != DONE
            if not bool(live_B.any()):
                break
            tok_B, logp_BV = self._sample(lm_head_logits(self.model, hidden_BH, self.fp32_head), sampling)
            if wait_len:  # budget forcing (min): an early </think> starts the forced "Wait" phrase
                self._suppress_early_close(phase, closer.completes(tok_B), live_B, n_think, n_waits, forced_pos,
                                           forced_kind, length)
            # Forced rows take the next token of their phrase instead of the sampled one.
            forced_B = phase == FORCED
            if forced_table.shape[1]:
                col = forced_pos.clamp(max=forced_table.shape[1] - 1)
                tok_B = torch.where(forced_B, forced_table[forced_kind, col], tok_B)
            logp_B = logp_BV.gather(-1, tok_B.unsqueeze(-1)).squeeze(-1)  # forced tokens: masked later
            steps_tok.append(tok_B)
            steps_logp.append(logp_B)
            steps_forced.append(forced_B)
            steps_live.append(live_B)
            steps_version.append(self.version)
            self._advance(phase, tok_B, live_B, forced_B, n_think, n_answer, forced_pos, cut_at,
                          interrupted, truncated, length, phrase_len, forced_kind=forced_kind, wait_len=wait_len,
                          stop_ids=stop_ids, closing=closer.completes(tok_B), end_ids=end_ids,
                          stopping=None if stopper is None else stopper.completes(tok_B))
            closer.push(tok_B)
            if stopper is not None:
                stopper.push(tok_B)
            if not bool((phase != DONE).any()):
                break
            # Hot-swap between decode steps, keeping the KV cache.
            if policy_source is not None:
                update = policy_source()
                if update is not None and update[0] > self.version:
                    self.load_weights(update[1], update[0])
                    self.swaps_in_flight += 1
            attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=dev)], dim=1)
            pos_B = pos_B + 1
            out = trunk(input_ids=tok_B.unsqueeze(-1), attention_mask=attn, position_ids=pos_B.unsqueeze(-1),
                        past_key_values=cache, use_cache=True)
            cache, hidden_BH = out.past_key_values, out.last_hidden_state[:, -1]
        truncated |= phase != DONE  # ran out of positions
        return self._collect(B, steps_tok, steps_logp, steps_forced, steps_live, steps_version,
                             n_think, interrupted, truncated, length.all_end_ids)

    @staticmethod
    def _forced_table(length: LengthControl, dev: torch.device) -> torch.Tensor:
        """[2, L] token ids: row INTERRUPT = the interruption phrase, row WAIT = the "Wait" phrase."""
        rows = [list(length.interruption_ids or ()), list(length.wait_ids)]
        width = max(len(r) for r in rows)
        table = torch.zeros((2, width), dtype=torch.long, device=dev)
        for kind, row in enumerate(rows):
            table[kind, :len(row)] = torch.tensor(row, dtype=torch.long)
        return table

    @staticmethod
    def _suppress_early_close(phase: torch.Tensor, closing: torch.Tensor, live: torch.Tensor, n_think: torch.Tensor,
                              n_waits: torch.Tensor, forced_pos: torch.Tensor, forced_kind: torch.Tensor,
                              length: LengthControl) -> None:
        """Budget forcing (min), before the token is recorded: a thinking row whose sampled token
        completes `</think>` (`closing` [B]) with fewer than `min_thinking` thinking tokens and fewer
        than `max_waits` waits so far enters FORCED with the "Wait" phrase from its first token (which
        replaces that token; with a multi-token `</think>` the tokens before it stay). In place."""
        early = (live & (phase == THINKING) & closing
                 & (n_think < length.min_thinking) & (n_waits < length.max_waits))
        phase[early] = FORCED
        forced_kind[early] = WAIT
        forced_pos[early] = 0
        n_waits += early.long()

    @staticmethod
    def _advance(phase: torch.Tensor, tok: torch.Tensor, live: torch.Tensor, forced: torch.Tensor,
                 n_think: torch.Tensor, n_answer: torch.Tensor, forced_pos: torch.Tensor,
                 cut_at: torch.Tensor, interrupted: torch.Tensor, truncated: torch.Tensor,
                 length: LengthControl, phrase_len: int, *, forced_kind: torch.Tensor | None = None,
                 wait_len: int = 0, stop_ids: torch.Tensor | None = None, closing: torch.Tensor | None = None,
                 end_ids: torch.Tensor | None = None, stopping: torch.Tensor | None = None) -> None:
        """Move each row's state machine by the token it just emitted (all in place, vectorised).

        `wait_len` > 0 (budget forcing's minimum) needs `forced_kind` [B], which phrase a FORCED row is
        in; otherwise every FORCED row is in the interruption phrase. `stop_ids`: `length.stop_ids` as a
        tensor (built once per generate call, not per step). `closing` [B]: the token completes `</think>`
        (`CloseMatcher`; default: it equals a one-token spelling). `end_ids`: `length.all_end_ids` as a
        tensor (default built here). `stopping` [B]: the token completes one of `length.stop_sequences`."""
        thinking = live & (phase == THINKING)
        answering = live & (phase == ANSWER)
        if end_ids is None:
            end_ids = torch.tensor(length.all_end_ids, dtype=torch.long, device=tok.device)
        is_eos = torch.isin(tok, end_ids)
        if closing is None:
            singles = [seq[0] for seq in length.close_sequences if len(seq) == 1]
            closing = torch.isin(tok, torch.tensor(singles, dtype=torch.long, device=tok.device))
        # THINKING: count ("Wait" tokens too); </think> -> ANSWER; EOS or a stop id -> DONE;
        # cut point -> FORCED interruption (or truncate).
        closes = thinking & closing
        stops = thinking & is_eos
        if stop_ids is not None:
            stops |= thinking & torch.isin(tok, stop_ids)
        if stopping is not None:
            stops |= thinking & stopping & ~closes
        phase[closes] = ANSWER
        phase[stops] = DONE
        may_cut = thinking & ~closes & ~stops
        # FORCED: advance through the phrase; at the end of the interruption phrase -> ANSWER, at the end
        # of "Wait" -> THINKING again (or straight into the interruption if the budget is used up).
        forced_pos += forced.long()
        if wait_len:
            assert forced_kind is not None
            waiting = forced & (forced_kind == WAIT)
            n_think += (thinking | waiting).long()
            phrase_end = forced & (forced_pos >= torch.where(waiting, wait_len, phrase_len))
            resumes = phrase_end & waiting
            phase[phrase_end & ~waiting] = ANSWER
            phase[resumes] = THINKING
            forced_kind[resumes] = INTERRUPT  # the next forced phrase, if any, is the interruption
            forced_pos[resumes] = 0
            may_cut |= resumes
        else:
            n_think += thinking.long()
            phase[forced & (forced_pos >= phrase_len)] = ANSWER
        at_cut = may_cut & (n_think >= cut_at)
        if phrase_len:
            phase[at_cut] = FORCED
            interrupted |= at_cut
        else:
            phase[at_cut] = DONE
            truncated |= at_cut
        # ANSWER: count; EOS -> DONE; budget -> DONE (truncated).
        n_answer += answering.long()
        phase[answering & is_eos] = DONE
        over = answering & ~is_eos & (n_answer >= length.answer_budget)
        phase[over] = DONE
        truncated |= over

    def _collect(self, B: int, steps_tok: list[torch.Tensor], steps_logp: list[torch.Tensor],
                 steps_forced: list[torch.Tensor], steps_live: list[torch.Tensor], steps_version: list[int],
                 n_think: torch.Tensor, interrupted: torch.Tensor, truncated: torch.Tensor,
                 end_ids: tuple[int, ...]) -> list[Completion]:
        tok_SB = torch.stack(steps_tok).cpu()
        logp_SB = torch.stack(steps_logp).cpu()
        forced_SB = torch.stack(steps_forced).cpu()
        live_SB = torch.stack(steps_live).cpu()
        versions = torch.tensor(steps_version)
        out = []
        for b in range(B):
            sel = live_SB[:, b]
            toks = tok_SB[sel, b].tolist()
            reason: FinishReason = "length" if truncated[b] else ("interrupted" if interrupted[b] else "stop")
            out.append(Completion(
                token_ids=toks,
                logprobs=logp_SB[sel, b].tolist(),
                versions=versions[sel].tolist(),
                loss_mask=(~forced_SB[sel, b]).tolist(),
                finish_reason=reason,
                text=self.completion_text(toks, end_ids),
                thinking_tokens=int(n_think[b]),
            ))
        return out
