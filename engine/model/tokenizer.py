"""Byte-level tokenizer shared by every model (sim, tiny, drafts).

Keeps: ids ``0..255`` are the bytes of the UTF-8 text, in order, so
``decode(encode(s)) == s`` for every str; three specials follow (BOS, EOS, PAD).
``decode`` never raises: invalid UTF-8 becomes U+FFFD, out-of-vocabulary ids are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable

NUM_BYTES = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259
SPECIAL_IDS = frozenset({BOS_ID, EOS_ID, PAD_ID})
_SPECIAL_TEXT = {BOS_ID: "<s>", EOS_ID: "</s>", PAD_ID: "<pad>"}


class ByteTokenizer:
    """UTF-8 bytes as tokens; BOS/EOS/PAD above the byte range."""

    bos_token_id = BOS_ID
    eos_token_id = EOS_ID
    pad_token_id = PAD_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text``: optional BOS, then one id per UTF-8 byte."""
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. Specials are dropped (or spelled ``<s>``/``</s>``/``<pad>``);
        byte runs decode with ``errors="replace"`` so a cut multi-byte character or any
        invalid sequence yields U+FFFD instead of raising; ids outside the vocabulary are
        dropped."""
        parts: list[str] = []
        run = bytearray()
        for tok in ids:
            tok = int(tok)
            if 0 <= tok < NUM_BYTES:
                run.append(tok)
                continue
            if tok in SPECIAL_IDS and not skip_special_tokens:
                parts.append(run.decode("utf-8", errors="replace"))
                run.clear()
                parts.append(_SPECIAL_TEXT[tok])
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)
