"""The sliding-window convention (kernels/window.py): keys [max(0, q - W), q], None = causal."""

from __future__ import annotations

import pytest
import torch

from kernels.window import NO_WINDOW, normalize_window, visible_mask, window_start


@pytest.mark.parametrize(
    ("q_pos", "window", "start"),
    [(10, 3, 7), (2, 5, 0), (5, 5, 0), (6, 5, 1), (4, 0, 4), (9, None, 0), (9, -1, 0)],
)
def test_window_start_is_q_minus_w_clamped_at_zero(
    q_pos: int, window: int | None, start: int
) -> None:
    """A query at q with window W first attends max(0, q - W); no window starts at 0."""
    assert window_start(q_pos, window) == start


def test_normalize_window_maps_none_and_negative_to_no_window() -> None:
    """None and every W < 0 (SGLang's -1) mean no window; W >= 0 is kept as is."""
    assert normalize_window(None) == normalize_window(-1) == normalize_window(-7) == NO_WINDOW
    assert normalize_window(0) == 0 and normalize_window(127) == 127


@pytest.mark.parametrize("window", [0, 1, 3, 50])
def test_visible_mask_has_w_plus_one_keys_ending_at_the_query(window: int) -> None:
    """Each query sees min(q + 1, W + 1) keys, the last one being itself, none in its future."""
    pos = torch.arange(12)
    mask = visible_mask(pos, pos, window)
    assert mask.sum(1).tolist() == [min(q + 1, window + 1) for q in range(12)]
    assert mask.diagonal().all() and not mask.triu(1).any()
    for q in range(12):
        assert mask[q].nonzero().min().item() == window_start(q, window)


def test_visible_mask_without_window_is_causal() -> None:
    """No window: the mask is the lower triangle, also for queries offset after a prefix."""
    k_pos = torch.arange(9)
    mask = visible_mask(torch.arange(5, 9), k_pos, None)
    assert torch.equal(mask, torch.ones(4, 9, dtype=torch.bool).tril(5))
