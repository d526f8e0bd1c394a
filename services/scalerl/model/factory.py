"""Model and tokenizer factory, and the FP32 LM head shared by generator and learner.

The tiny model is a Llama-architecture `LlamaForCausalLM` built from a config (no downloads); the
tokenizer is the character-level `PreTrainedTokenizerFast` of `scalerl.model.tokenizer`. Both save
and reload with `save_pretrained`, so any local Hugging Face model folder can stand in for them.

FP32 head (ScaleRL §2.3): generator and learner both compute the final projection and the
log-softmax in float32 from the last hidden state, whatever the model's dtype. The same function
(`lm_head_logits`) is used on both sides, so at step 0 the generator's recorded log-probs and the
learner's teacher-forced log-probs agree (|log ρ| < 1e-4 on CPU fp32).

Tied embeddings (SmolLM2, most small instruct models): `lm_head.weight is embed_tokens.weight`, one
`Parameter`. Keeping the head in fp32 converts that one parameter in place (the tie stays: one
tensor, gradients from both uses, one optimizer state); in a bfloat16 model the embedding's output is
cast back to bfloat16 by a forward hook so the trunk still runs in bfloat16.

Memory of the head: the learner's logits are [N, L, V] float32, V × 4 bytes per token (49,152 × 4 =
192 KiB per token for SmolLM2), and the log-softmax and its gradient as much again. `sequence_logprobs`
therefore computes head + log-softmax in chunks of at most `LOGIT_CHUNK_ELEMENTS` logits under
activation checkpointing: only one chunk's [T, V] is alive at a time, in forward and in backward. For
the tiny model's 102 symbols one chunk holds every token of any batch (the old single pass).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers import PreTrainedTokenizerBase as Tokenizer

from scalerl.config import ModelConfig
from scalerl.model.sources import model_folder, offline
from scalerl.model.tokenizer import build_char_tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LOGIT_CHUNK_ELEMENTS = 1 << 24  # float32 logits per chunk of the learner's head: 64 MiB (341 tokens at V=49,152)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_tiny_model(cfg: ModelConfig, tokenizer: Tokenizer, seed: int) -> LlamaForCausalLM:
    """A freshly initialised tiny Llama sized by `cfg.tiny` (seeded, deterministic)."""
    t = cfg.tiny
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_layers,
        num_attention_heads=t.num_heads,
        num_key_value_heads=t.num_heads,
        max_position_embeddings=t.max_positions,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: LlamaForCausalLM = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    return model


def load_model_and_tokenizer(cfg: ModelConfig, seed: int, folder: str | Path | None = None,
                             ) -> tuple[torch.nn.Module, Tokenizer]:
    """Load from `folder` (a saved policy), else `cfg.path` (a folder, a .gguf converted once into the cache,
    or a package file: `scalerl.model.sources`), else build the tiny model and the char tokenizer."""
    src = folder if folder is not None else (model_folder(cfg.path, cfg.dtype) if cfg.path is not None else None)
    dtype = _DTYPES[cfg.dtype]
    model: torch.nn.Module
    if src is not None:
        offline()
        tokenizer = AutoTokenizer.from_pretrained(str(src))
        model = AutoModelForCausalLM.from_pretrained(str(src), dtype=dtype, attn_implementation="sdpa")
    else:
        tokenizer = build_char_tokenizer()
        model = torch.nn.Module.to(build_tiny_model(cfg, tokenizer, seed), dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.fp32_lm_head:
        keep_head_in_fp32(model)
    return model, tokenizer


def embedding_rows(model: Any) -> int:
    """The token ids `model` can embed: [0, this)."""
    return int(model.get_input_embeddings().num_embeddings)


def save_model_and_tokenizer(model: torch.nn.Module, tokenizer: Tokenizer, folder: str | Path) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))  # type: ignore[operator]
    tokenizer.save_pretrained(str(folder))


def trunk_of(model: Any) -> torch.nn.Module:
    """The decoder stack without the LM head (`model.model` for Llama)."""
    trunk = getattr(model, model.base_model_prefix, None)
    if trunk is None:
        raise TypeError(f"{type(model).__name__} exposes no base model '{model.base_model_prefix}'")
    return trunk  # type: ignore[no-any-return]


def heads_tied(model: Any) -> bool:
    """True when the LM head and the input embedding are one parameter."""
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and emb is not None and head.weight is emb.weight


def keep_head_in_fp32(model: Any) -> None:
    """Store the LM head's parameters in float32 (whatever the model's dtype): the FP32 head.

    `Module.float()` converts in place (`param.data`), so a tied weight stays one parameter; in a lower-
    precision model its embedding output is cast back to the trunk's dtype."""
    trunk_dtype = model.get_input_embeddings().weight.dtype
    tied = heads_tied(model)
    model.get_output_embeddings().float()
    if tied and trunk_dtype != torch.float32:
        model.get_input_embeddings().register_forward_hook(lambda _m, _args, out: out.to(trunk_dtype))


def lm_head_logits(model: Any, hidden: torch.Tensor, fp32_head: bool) -> torch.Tensor:
    """Logits from the last hidden state. hidden: [..., H] -> [..., V] (float32 if `fp32_head`).

    The head is called as a module (so FSDP's unshard hooks run); with `fp32_head` the hidden state is
    cast up and the matmul runs in float32 against the float32 head from `keep_head_in_fp32`.
    """
    head = model.get_output_embeddings()
    if not fp32_head:
        return head(hidden)  # type: ignore[no-any-return]
    weight = head.weight
    if weight.dtype != torch.float32:  # head not kept in fp32: upcast a copy (no FSDP here)
        bias = head.bias.float() if getattr(head, "bias", None) is not None else None
        return F.linear(hidden.float(), weight.float(), bias)
    return head(hidden.float()).float()  # type: ignore[no-any-return]


def sequence_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      targets: torch.Tensor, *, fp32_head: bool, temperature: float = 1.0,
                      with_entropy: bool = False,
                      where: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probs of `targets` under the model (the learner side of ρ).

    input_ids, attention_mask, targets: [N, L] (right-padded; targets[:, t] is the token that follows
    input_ids[:, t]). Returns logp: [N, L] float32 and, if asked, the per-position entropy [N, L]
    (no grad). Logits are divided by `temperature`, as the generator's were when it sampled. `where`
    ([N, L] bool, e.g. the loss mask): only those positions go through the head; logp and entropy are
    0 elsewhere (the prompt and the padding then cost the trunk alone).
    """
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = trunk_of(model)(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                          use_cache=False)
    return head_logprobs(model, out.last_hidden_state, targets, fp32_head=fp32_head, temperature=temperature,
                         with_entropy=with_entropy, where=where)


@torch.no_grad()
def completion_logprobs(model: Any, prompt_ids: list[int], completion_ids: list[int], *, fp32_head: bool = True,
                        temperature: float = 1.0) -> torch.Tensor:
    """The learner's log-probs of one completion's tokens after its prompt (what a generator's recorded
    log-probs are compared with: log ρ = this − recorded). Returns [len(completion_ids)] float32."""
    ids = torch.tensor([prompt_ids + completion_ids])
    logp, _ = sequence_logprobs(model, ids[:, :-1], torch.ones_like(ids[:, :-1]), ids[:, 1:],
                                fp32_head=fp32_head, temperature=temperature)
    return logp[0, len(prompt_ids) - 1:]


def head_logprobs(model: Any, hidden: torch.Tensor, targets: torch.Tensor, *, fp32_head: bool,
                  temperature: float = 1.0, with_entropy: bool = False,
                  chunk_elements: int = LOGIT_CHUNK_ELEMENTS,
                  where: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) from the last hidden state, the head and log-softmax in token chunks.

    hidden: [N, L, H], targets: [N, L] -> logp [N, L] float32 (and entropy [N, L], no grad). A chunk holds
    at most `chunk_elements` logits (>= 1 token); with more than one chunk each runs under activation
    checkpointing, so backward recomputes a chunk's logits instead of keeping all [N, L, V] alive.
    `where` ([N, L] bool): only those positions are computed, the others are 0."""
    N, L, H = hidden.shape
    if where is not None:
        idx = where.reshape(N * L).nonzero().squeeze(-1)  # [T]
        logp_t, ent_t = head_logprobs(model, hidden.reshape(1, N * L, H)[:, idx], targets.reshape(1, N * L)[:, idx],
                                      fp32_head=fp32_head, temperature=temperature, with_entropy=with_entropy,
                                      chunk_elements=chunk_elements)
        logp = hidden.new_zeros(N * L, dtype=torch.float32).index_copy(0, idx, logp_t.reshape(-1))
        entropy = (hidden.new_zeros(N * L, dtype=torch.float32).index_copy(0, idx, ent_t.reshape(-1)).reshape(N, L)
                   if ent_t is not None else None)
        return logp.reshape(N, L), entropy
    vocab = model.get_output_embeddings().weight.shape[0]
    per_chunk = max(1, chunk_elements // vocab)
    flat_h, flat_t = hidden.reshape(N * L, H), targets.reshape(N * L)

    def chunk(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp_all = torch.log_softmax(lm_head_logits(model, h, fp32_head).float() / temperature, dim=-1)  # [T, V]
        logp = logp_all.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            ent = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else logp.new_zeros(())
        return logp, ent

    if per_chunk >= N * L:
        parts = [chunk(flat_h, flat_t)]
    else:
        parts = [checkpoint(chunk, flat_h[i:i + per_chunk], flat_t[i:i + per_chunk], use_reentrant=False)
                 for i in range(0, N * L, per_chunk)]
    logp = torch.cat([p[0] for p in parts]).reshape(N, L)
    entropy = torch.cat([p[1].reshape(-1) for p in parts]).reshape(N, L) if with_entropy else None
    return logp, entropy


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
