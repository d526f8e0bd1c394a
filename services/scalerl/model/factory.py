"""Model and tokenizer factory, and the FP32 LM head shared by generator and learner.

The tiny model is a Llama-architecture `LlamaForCausalLM` built from a config (no downloads); the
tokenizer is the character-level `PreTrainedTokenizerFast` of `scalerl.model.tokenizer`. Both save
and reload with `save_pretrained`, so any local Hugging Face model folder can stand in for them.

FP32 head (ScaleRL §2.3): generator and learner both compute the final projection and the
log-softmax in float32 from the last hidden state, whatever the model's dtype. The same function
(`lm_head_logits`) is used on both sides, so at step 0 the generator's recorded log-probs and the
learner's teacher-forced log-probs agree (|log ρ| < 1e-4 on CPU fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers import PreTrainedTokenizerBase as Tokenizer

from scalerl.config import ModelConfig
from scalerl.model.tokenizer import build_char_tokenizer

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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
    """Load from `folder` (or `cfg.path`), else build the tiny model and the char tokenizer."""
    src = folder if folder is not None else cfg.path
    dtype = _DTYPES[cfg.dtype]
    model: torch.nn.Module
    if src is not None:
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


def model_vocab_size(cfg: ModelConfig) -> int:
    """Rows of the policy's embedding (valid token ids are [0, this)) without loading its weights: the
    config of `init_checkpoint` (else `path`), else the tiny model's (the char tokenizer's size)."""
    from transformers import AutoConfig

    src = cfg.init_checkpoint or cfg.path
    if src is not None:
        return int(AutoConfig.from_pretrained(str(src)).vocab_size)
    return len(build_char_tokenizer())


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


def keep_head_in_fp32(model: Any) -> None:
    """Store the LM head's parameters in float32 (whatever the model's dtype): the FP32 head."""
    model.get_output_embeddings().float()


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
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probs of `targets` under the model (the learner side of ρ).

    input_ids, attention_mask, targets: [N, L] (right-padded; targets[:, t] is the token that follows
    input_ids[:, t]). Returns logp: [N, L] float32 and, if asked, the per-position entropy [N, L]
    (no grad). Logits are divided by `temperature`, as the generator's were when it sampled.
    """
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = trunk_of(model)(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                          use_cache=False)
    logits = lm_head_logits(model, out.last_hidden_state, fp32_head).float() / temperature  # [N, L, V]
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, L]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
