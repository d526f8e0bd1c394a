"""A character-level tokenizer for the tiny from-scratch model, built offline (no downloads).

Why characters: the quickstart tasks (addition, multiplication, Countdown) are digit-by-digit
procedures, and a tiny transformer learns them far more easily when every digit is its own token.
Wrapping the `tokenizers` model in a `PreTrainedTokenizerFast` lets the rest of the stack treat it
exactly like a Hugging Face tokenizer (`save_pretrained` / `AutoTokenizer.from_pretrained`, padding,
`decode`).

Vocabulary (ids are stable; tests pin them):

    0 <pad>   1 <bos>   2 <eos>   3 <unk>   4 <think>   5 </think>
    6 "\\n"   7 " "   8 "!"  ...  101 "~"          (printable ASCII in code-point order)

Rules:

1. `<think>` and `</think>` are added (special) tokens, matched before the per-character split, so
   `"</think>"` is one token anywhere in the text, including inside the ScaleRL interruption phrase.
2. Everything else is split into single characters; a character outside the vocabulary becomes
   `<unk>`. There is no normaliser, so `decode(encode(s)) == s` for any in-vocabulary `s`.
3. **No special tokens are added by `encode`**, whatever `add_special_tokens` says (there is no
   post-processor): the caller prepends `<bos>` explicitly, and `<eos>` ends gold solutions only
   where the SFT code puts it. This keeps prompt ids identical between generator and learner.
4. `padding_side="left"` (generation batches), `model_max_length=4096`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, THINK_OPEN, THINK_CLOSE)
# "\n" then printable ASCII from space (0x20) to "~" (0x7e), in code-point order.
CHARACTERS: tuple[str, ...] = ("\n", *(chr(c) for c in range(0x20, 0x7F)))
MODEL_MAX_LENGTH = 4096


def char_vocab() -> dict[str, int]:
    """Token → id: the special tokens first (`<pad>` = 0), then one id per character."""
    return {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}


def _build_backend() -> Tokenizer:
    tok = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK))
    # `[\s\S]` rather than `.`: the latter would not match "\n" and leave it glued to a neighbour.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate pieces; the default decoder joins them with spaces
    # Registered as special tokens so they are matched before the split and can be skipped on decode.
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer as a `PreTrainedTokenizerFast` (see the module docstring)."""
    from transformers import PreTrainedTokenizerFast  # lazily: importing transformers takes ~2 s

    return PreTrainedTokenizerFast(
        tokenizer_object=_build_backend(),
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=[THINK_OPEN, THINK_CLOSE],
        padding_side="left",
        model_max_length=MODEL_MAX_LENGTH,
        # transformers would otherwise rewrite " ." → "." etc. on decode and break round trips.
        clean_up_tokenization_spaces=False,
    )
