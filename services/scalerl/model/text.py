"""The tokenizer contract: how every role turns a task prompt into ids and knows where text ends.

One contract for every tokenizer, read from the tokenizer itself (never from the model's name):

1. **Prompt ids** (`encode_prompt`): a tokenizer with a chat template gets the prompt as the user
   message of a conversation rendered by its template with the generation prompt added (the template
   supplies its own system message when it has one, e.g. SmolLM2's "You are a helpful AI assistant
   ..."); no further special tokens are added, since the template already holds them. A tokenizer
   without a template (the character tokenizer of the tiny model) gets its BOS, if any, then the
   prompt's tokens.
2. **Where a completion ends** (`end_ids`): the tokenizer's EOS plus the end-of-turn tokens it has
   as special tokens (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`, `<|end|>`).
3. **`</think>` in ids** (`think_close_spellings`): one id where the tokenizer has `</think>` as a
   token (the char tokenizer, Qwen3), else its BPE spellings: alone and after a space or a newline
   (SmolLM2 writes `</think>` as "</", "think", ">" but " </think>" as " </", "think", ">"). The
   first is the canonical spelling (what budget forcing forces); the generator ends thinking on any.
4. **Text ids** (`text_ids`): a string's tokens with no special tokens added (interruption phrase,
   "Wait", answer prefixes, gold solutions).
"""

from __future__ import annotations

from typing import Any

from scalerl.model.tokenizer import THINK_CLOSE

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")
_CLOSE_CONTEXTS = (" ", "\n")  # what commonly precedes `</think>` in text and can change its BPE spelling


def text_ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    """`text`'s token ids, no special tokens added."""
    return tuple(int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"])


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """The ids a completion of `prompt` is conditioned on (rule 1 of the module docstring)."""
    if has_chat_template(tokenizer):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
        return list(text_ids(tokenizer, str(rendered)))
    ids = list(text_ids(tokenizer, prompt))
    bos = tokenizer.bos_token_id
    return [int(bos), *ids] if bos is not None else ids


def token_id(tokenizer: Any, token: str) -> int | None:
    """The id of `token` if the tokenizer has it as one token (not mapped to unk), else None."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or isinstance(tid, list):
        return None
    if tid == tokenizer.unk_token_id and token != tokenizer.unk_token:
        return None
    return int(tid) if tokenizer.convert_ids_to_tokens(int(tid)) == token else None


def end_ids(tokenizer: Any) -> tuple[int, ...]:
    """EOS first, then the end-of-turn tokens the tokenizer has (rule 2)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token")
    out = [int(eos)]
    for tok in END_OF_TURN_TOKENS:
        tid = token_id(tokenizer, tok)
        if tid is not None and tid not in out:
            out.append(tid)
    return tuple(out)


def think_close_spellings(tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """Token sequences of `</think>`, the canonical one first (rule 3)."""
    return tag_spellings(tokenizer, THINK_CLOSE)


def tag_spellings(tokenizer: Any, tag: str) -> tuple[tuple[int, ...], ...]:
    """Token sequences of a closing tag such as `</think>` or `</tool>`, the canonical one first: its
    special token where the tokenizer has one, else its own spelling and those after a space or newline."""
    single = token_id(tokenizer, tag)
    if single is not None:
        return ((single,),)
    spellings = [text_ids(tokenizer, tag)]
    for before in _CLOSE_CONTEXTS:
        ctx, both = text_ids(tokenizer, before), text_ids(tokenizer, before + tag)
        # The context's own tokens are dropped when they stand apart; a merged one (" </") is kept.
        seq = both[len(ctx):] if both[:len(ctx)] == ctx else both
        if seq and seq not in spellings:
            spellings.append(seq)
    if not spellings[0]:
        raise ValueError(f"the tokenizer encodes {tag!r} as no tokens")
    return tuple(spellings)
