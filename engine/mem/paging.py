"""Pure-int page/token arithmetic: every page boundary the engine computes comes from here.

Keeps: results are page multiples where the name says so, and ranges are well-formed
(`start <= end`). Each function carries PEP316 contracts that CrossHair checks
(tests/contracts/); nothing here imports torch or numpy, so the solver sees plain ints.

Notation: ``ps`` = page size in tokens; page ``p`` holds slots ``[p*ps, (p+1)*ps)``.
"""

from __future__ import annotations

from collections.abc import Sequence


def ceil_align(x: int, ps: int) -> int:
    """Smallest multiple of ``ps`` that is ``>= x``.

    pre: x >= 0
    pre: ps > 0
    post: __return__ % ps == 0
    post: x <= __return__ < x + ps
    """
    return -(-x // ps) * ps


def floor_align(x: int, ps: int) -> int:
    """Largest multiple of ``ps`` that is ``<= x``.

    pre: x >= 0
    pre: ps > 0
    post: __return__ % ps == 0
    post: x - ps < __return__ <= x
    """
    return x // ps * ps


def num_pages(num_tokens: int, ps: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens (a partial last page counts whole).

    pre: num_tokens >= 0
    pre: ps > 0
    post: __return__ * ps >= num_tokens
    post: (__return__ - 1) * ps < num_tokens or __return__ == 0
    """
    return -(-num_tokens // ps)


def page_of(slot: int, ps: int) -> int:
    """The page that holds KV slot ``slot``.

    pre: slot >= 0
    pre: ps > 0
    post: __return__ * ps <= slot < (__return__ + 1) * ps
    """
    return slot // ps


def num_new_pages(prefix_len: int, seq_len: int, ps: int) -> int:
    """Fresh pages an extend from ``prefix_len`` to ``seq_len`` takes (SGLang's
    ``get_num_new_pages``): the partial page the prefix ends in is filled first.

    pre: 0 <= prefix_len <= seq_len
    pre: ps > 0
    post: __return__ >= 0
    post: __return__ * ps <= ceil_align(seq_len, ps) - floor_align(prefix_len, ps)
    post: (prefix_len % ps != 0) or __return__ * ps >= seq_len - prefix_len
    """
    return num_pages(seq_len, ps) - num_pages(prefix_len, ps)


def decode_needs_page(seq_len: int, ps: int) -> bool:
    """Whether decoding position ``seq_len - 1`` (``seq_len`` counted after the +1) opens a
    new page, i.e. the token lands on a page's first slot.

    pre: seq_len >= 1
    pre: ps > 0
    post: __return__ == ((seq_len - 1) % ps == 0)
    """
    return (seq_len - 1) % ps == 0


def tail_free_range(committed_len: int, allocated_len: int, ps: int) -> tuple[int, int]:
    """Token range ``[start, end)`` of the over-allocated tail that release frees.

    ``start = ceil(committed)`` because a paged free releases whole pages: starting lower
    would free the page that still holds committed KV (the #22862 hazard).

        [0, committed)                  committed KV: goes to the cache
        [committed, ceil(committed))    same page as committed KV: kept
        [ceil(committed), allocated)    over-allocated tail: freed

    pre: 0 <= committed_len <= allocated_len
    pre: ps > 0
    post: __return__[0] % ps == 0
    post: committed_len <= __return__[0] <= __return__[1]
    post: __return__[1] == max(__return__[0], allocated_len)
    """
    start = ceil_align(committed_len, ps)
    return start, max(start, allocated_len)


def held_len(allocated_len: int, protected_len: int, ps: int) -> int:
    """KV a row owns beyond its tree-protected prefix (SGLang's ``held``/``uncached``):
    the partial last page is owned whole.

    pre: allocated_len >= 0 and protected_len >= 0
    pre: ps > 0
    post: __return__ == ceil_align(allocated_len, ps) - protected_len
    post: protected_len > allocated_len or __return__ >= 0
    """
    return ceil_align(allocated_len, ps) - protected_len


def total_held_len(allocated_lens: Sequence[int], protected_lens: Sequence[int], ps: int) -> int:
    """Σ ``held_len`` over rows, without a call per row (a view sums it per live request).

    pre: len(allocated_lens) == len(protected_lens) and ps > 0
    post: __return__ == sum(held_len(a, p, ps) for a, p in zip(allocated_lens, protected_lens))
    """
    aligned = allocated_lens if ps == 1 else [-(-a // ps) * ps for a in allocated_lens]
    return sum(aligned) - sum(protected_lens)


def held_swa_len(allocated_len: int, protected_len: int, swa_evicted_len: int, ps: int) -> int:
    """SWA KV a row owns: the window part not yet evicted and not in the tree.

    pre: allocated_len >= 0 and protected_len >= 0 and swa_evicted_len >= 0
    pre: ps > 0
    post: __return__ == ceil_align(allocated_len, ps) - max(protected_len, swa_evicted_len)
    post: __return__ <= held_len(allocated_len, protected_len, ps)
    """
    return ceil_align(allocated_len, ps) - max(protected_len, swa_evicted_len)


def chunk_len(rem_chunk_tokens: int, ps: int) -> int:
    """Tokens a truncated chunked prefill may take: the budget floored to whole pages
    (``PrefillAdder.add_one_req``: ``trunc_len = rem_chunk_tokens // ps * ps``; the budget
    may already be negative, and a result ``<= 0`` means no chunk fits).

    pre: ps > 0
    post: __return__ % ps == 0
    post: rem_chunk_tokens - ps < __return__ <= rem_chunk_tokens
    """
    return rem_chunk_tokens // ps * ps


def swa_evict_cursor(
    swa_evicted_len: int, protected_len: int, seq_len: int, window: int, ps: int
) -> int:
    """New SWA eviction cursor: everything before ``seq_len - window - ps`` may be freed,
    never below the tree-protected prefix, never moving backwards, floored to a page.

    pre: swa_evicted_len >= 0 and protected_len >= 0 and seq_len >= 0
    pre: protected_len % ps == 0 and swa_evicted_len % ps == 0
    pre: window >= 0
    pre: ps > 0
    post: __return__ % ps == 0
    post: __return__ >= max(swa_evicted_len, protected_len)
    post: __return__ <= max(swa_evicted_len, protected_len, seq_len - window)
    """
    base = max(swa_evicted_len, protected_len)
    return max(base, floor_align(max(seq_len - window - ps, 0), ps))


def page_aligned_len(num_tokens: int, ps: int) -> int:
    """Length of the page-aligned head of a key: what a radix tree may store.

    pre: num_tokens >= 0
    pre: ps > 0
    post: __return__ % ps == 0
    post: num_tokens - ps < __return__ <= num_tokens
    """
    return floor_align(num_tokens, ps)
