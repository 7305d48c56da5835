"""A planted alignment bug for CrossHair to find (not part of the engine).

``(x + p - 1) & ~(p - 1)`` rounds up only when ``p`` is a power of two; page sizes are not
required to be one, so the contract is false for e.g. ``x=1, p=3``.
"""


def ceil_align_buggy(x: int, ps: int) -> int:
    """
    pre: x >= 0
    pre: ps > 0
    post: __return__ % ps == 0
    post: x <= __return__ < x + ps
    """
    return (x + ps - 1) & ~(ps - 1)
