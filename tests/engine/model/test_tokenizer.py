"""The byte tokenizer: bytes are ids 0..255, specials follow, decode never raises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.model.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer

TOK = ByteTokenizer()


def test_special_ids_follow_the_byte_range() -> None:
    """BOS, EOS, PAD are 256, 257, 258 and the vocabulary holds exactly them and the bytes."""
    assert (BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE) == (256, 257, 258, 259)
    assert TOK.vocab_size == VOCAB_SIZE and TOK.eos_token_id == EOS_ID


@given(st.text())
def test_round_trip(text: str) -> None:
    """decode(encode(s)) == s for every str; encode is BOS + the UTF-8 bytes."""
    ids = TOK.encode(text)
    assert ids[0] == BOS_ID and ids[1:] == list(text.encode("utf-8"))
    assert TOK.encode(text, add_bos=False) == ids[1:]
    assert TOK.decode(ids) == text


def test_specials_are_skipped_or_spelled() -> None:
    """skip_special_tokens drops BOS/EOS/PAD; without it they are spelled, bytes untouched."""
    ids = [BOS_ID, *b"hi", EOS_ID, PAD_ID]
    assert TOK.decode(ids) == "hi"
    assert TOK.decode(ids, skip_special_tokens=False) == "<s>hi</s><pad>"


def test_invalid_utf8_is_replaced() -> None:
    """A stray continuation byte or a cut multi-byte character becomes U+FFFD; an EOS
    between the halves of a character does not join them."""
    assert TOK.decode([0xFF, ord("A")]) == "\ufffdA"
    euro = list("€".encode())
    assert TOK.decode(euro[:2]) == "\ufffd"
    assert TOK.decode([*euro[:2], EOS_ID, euro[2]], skip_special_tokens=False).count("\ufffd") == 2


@given(st.lists(st.integers(-5, 400), max_size=50), st.booleans())
def test_decode_never_raises(ids: list[int], skip: bool) -> None:
    """Any id list decodes to a str; ids outside the vocabulary are dropped."""
    assert isinstance(TOK.decode(ids, skip_special_tokens=skip), str)
    assert TOK.decode([-1, 1000, 65]) == "A"
