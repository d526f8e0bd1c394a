"""The tokenizer contract on the character tokenizer (no chat template) and on a BPE-like tokenizer
with a chat template built here offline (the real SmolLM2 tokenizer is checked in tests/e2e)."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from scalerl.model.text import encode_prompt, end_ids, text_ids, think_close_spellings
from scalerl.model.tokenizer import THINK_CLOSE

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chat_tokenizer() -> PreTrainedTokenizerFast:
    """Word pieces where `</think>` is three tokens ("</", "think", ">") and " </" merges a space."""
    pieces = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "</", " </", "think", ">", " ", "\n", "a", "b",
              "user", "assistant", "<", "/"]
    backend = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r" </|</|think|user|assistant|[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(pieces[:3])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  unk_token="<|endoftext|>", pad_token="<|im_end|>")
    tok.chat_template = TEMPLATE
    return tok


def test_char_tokenizer_contract(tokenizer):
    assert encode_prompt(tokenizer, "1+2=") == [tokenizer.bos_token_id, *text_ids(tokenizer, "1+2=")]
    assert end_ids(tokenizer) == (tokenizer.eos_token_id,)
    assert think_close_spellings(tokenizer) == ((tokenizer.convert_tokens_to_ids(THINK_CLOSE),),)


def test_chat_tokenizer_contract():
    tok = _chat_tokenizer()
    ids = encode_prompt(tok, "ab")
    rendered = "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(ids) == rendered
    assert ids.count(tok.bos_token_id) == 2, "the template's own <|im_start|>, no extra BOS"
    assert end_ids(tok) == (tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>"))
    spellings = think_close_spellings(tok)
    ids_of = tok.convert_tokens_to_ids
    assert spellings[0] == (ids_of("</"), ids_of("think"), ids_of(">"))
    assert (ids_of(" </"), ids_of("think"), ids_of(">")) in spellings
