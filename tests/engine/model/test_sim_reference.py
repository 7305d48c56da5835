"""The sim model's reference tokens: the compiled loop (sim_kernels.py) is the Python-int loop
of ``predict`` and the context hash, token for token, for any seed, EOS rate and context."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.model.fingerprint import KVFingerprints, splitmix64_int
from engine.model.sim import SimModel
from engine.model.sim_context import BASE, TERM_MUL
from engine.model.tokenizer import EOS_ID, NUM_BYTES

MASK = (1 << 64) - 1


def python_greedy(model: SimModel, prompt: list[int], n: int) -> list[int]:
    """The reference as the Python-int loop computes it (the kernel's specification)."""
    h, out = int(model.context_hash(prompt)), []
    for _ in range(n):
        coin = float(splitmix64_int(h ^ int(model._key_eos)) >> 11) * 2.0**-53
        byte = splitmix64_int(h ^ int(model._key_token)) % NUM_BYTES
        token = EOS_ID if coin < model.eos_prob else byte
        out.append(token)
        h = (h * BASE + (token + 1) * int(TERM_MUL)) & MASK
    return out


@given(
    st.integers(0, 2**32),
    st.lists(st.integers(0, 258), min_size=0, max_size=30),
    st.integers(0, 50),
    st.sampled_from([0.0, 0.05, 0.5, 1.0]),
)
def test_the_compiled_reference_is_the_python_loop(
    seed: int, prompt: list[int], n: int, eos_prob: float
) -> None:
    """``reference`` (no penalties: the compiled loop) returns the Python loop's tokens."""
    model = SimModel(seed, KVFingerprints(8), eos_prob=eos_prob)
    assert model.reference(prompt, n) == python_greedy(model, prompt, n)
