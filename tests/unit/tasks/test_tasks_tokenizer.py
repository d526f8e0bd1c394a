"""The character tokenizer: pinned ids, exact round trips, no auto-BOS, save/reload."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from scalerl.config import SCALERL_INTERRUPTION_PHRASE
from scalerl.model.tokenizer import CHARACTERS, THINK_CLOSE, THINK_OPEN, build_char_tokenizer

SAMPLES = [
    "357+468=",
    "<think>7+8+0=15,5+6+1=12,3+4+1=8</think>825",
    "  leading and trailing spaces  ",
    "a  b\n\nc\n",
    "3 7 25 50 -> 125:<think>50+25=75</think>(50+25)*2",
    string.printable.replace("\t", "").replace("\r", "").replace("\x0b", "").replace("\x0c", ""),
    "x</think>y<think>z</think>",
    " . , ! ? ' n't",  # would be "cleaned up" by transformers' default decode
]


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


def test_vocabulary_layout(tok: PreTrainedTokenizerFast) -> None:
    # 6 specials + "\n" + 95 printable ASCII characters (0x20..0x7e)
    assert len(tok) == 6 + 1 + 95
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    assert tok.convert_tokens_to_ids([THINK_OPEN, THINK_CLOSE]) == [4, 5]
    assert tok.convert_tokens_to_ids(["\n", " ", "!", "~"]) == [6, 7, 8, 101]
    assert set(CHARACTERS) == set(string.printable) - set("\t\r\x0b\x0c")
    assert tok.padding_side == "left"
    assert tok.model_max_length == 4096


def test_one_token_per_character(tok: PreTrainedTokenizerFast) -> None:
    assert tok.encode("357+468=") == [tok.convert_tokens_to_ids(c) for c in "357+468="]
    assert len(tok.encode("a b\nc")) == 5


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_exact(tok: PreTrainedTokenizerFast, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_think_tokens_are_single_and_skippable(tok: PreTrainedTokenizerFast) -> None:
    ids = tok.encode("<think>1+2=3</think>3")
    assert ids[0] == 4 and ids.count(5) == 1 and len(ids) == 1 + 5 + 1 + 1
    assert tok.decode(ids, skip_special_tokens=True) == "1+2=33"


def test_interruption_phrase_ends_with_one_close_token(tok: PreTrainedTokenizerFast) -> None:
    ids = tok.encode(SCALERL_INTERRUPTION_PHRASE)
    assert ids[-1] == tok.convert_tokens_to_ids(THINK_CLOSE)
    assert ids.count(5) == 1
    # every other character is its own token: len(text) - len("</think>") + 1
    assert len(ids) == len(SCALERL_INTERRUPTION_PHRASE) - len(THINK_CLOSE) + 1
    assert tok.decode(ids) == SCALERL_INTERRUPTION_PHRASE


def test_no_special_tokens_are_added(tok: PreTrainedTokenizerFast) -> None:
    text = "12+34="
    plain = tok.encode(text, add_special_tokens=False)
    assert tok.encode(text, add_special_tokens=True) == plain
    assert tok(text)["input_ids"] == plain
    assert tok.bos_token_id not in plain and tok.eos_token_id not in plain


def test_unknown_characters_map_to_unk(tok: PreTrainedTokenizerFast) -> None:
    assert tok.encode("1é\t2") == [tok.convert_tokens_to_ids("1"), 3, 3, tok.convert_tokens_to_ids("2")]


def test_left_padding(tok: PreTrainedTokenizerFast) -> None:
    batch = tok(["ab", "abcd"], padding=True)
    assert batch["input_ids"][0][:2] == [0, 0]
    assert batch["attention_mask"][0] == [0, 0, 1, 1]


@pytest.mark.parametrize("loader", [AutoTokenizer.from_pretrained, PreTrainedTokenizerFast.from_pretrained])
def test_save_and_reload_keeps_ids(tok: PreTrainedTokenizerFast, tmp_path: Path, loader: object) -> None:
    tok.save_pretrained(tmp_path)
    again = loader(str(tmp_path))  # type: ignore[operator]
    for text in [*SAMPLES, SCALERL_INTERRUPTION_PHRASE]:
        assert again.encode(text) == tok.encode(text)
        assert again.decode(again.encode(text)) == text
    assert again.get_vocab() == tok.get_vocab()
    assert (again.pad_token_id, again.bos_token_id, again.eos_token_id, again.unk_token_id) == (0, 1, 2, 3)
    assert again.padding_side == "left"
    assert again.model_max_length == 4096
