"""unique_rows: torch.unique(dim=0, return_inverse=True)'s result, from a radix order of packed keys."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from elmokit.modules.unique_rows import SMALL, unique_rows


def _reference(x):
    return torch.unique(x, dim=0, return_inverse=True)


@pytest.mark.parametrize(
    ("n", "c", "high"), [(3000, 20, 262), (2000, 50, 262), (1000, 11, 300_000), (SMALL, 1, 2), (4000, 3, 1)]
)
def test_equals_torch_unique_on_character_ids(n, c, high):
    """Random ids with many repeats (half the rows copied again, shuffled): the same distinct rows, in the same
    order, and the same inverse — for character ids (< 262), a word-id column's range and a single column."""
    g = torch.Generator().manual_seed(n + c)
    x = torch.randint(0, high, (n, c), generator=g)
    x = torch.cat([x, x[: n // 2]])[torch.randperm(n + n // 2, generator=g)]
    got, want = unique_rows(x), _reference(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[0][got[1]], x)


def test_hand_computed_order():
    """Rows ordered lexicographically by column, the first column most significant; the inverse points back."""
    x = torch.tensor([[2, 0], [1, 5], [2, 0], [1, 4], [0, 9]] * 60)  # 300 rows: the radix path
    unique, inverse = unique_rows(x)
    assert unique.tolist() == [[0, 9], [1, 4], [1, 5], [2, 0]]
    assert inverse[:5].tolist() == [3, 2, 3, 1, 0]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(SMALL, 600), st.integers(1, 30), st.sampled_from([2, 7, 262, 2**20, 2**40]), st.integers(0, 2**31 - 1)
)
def test_property_equals_torch_unique(n, c, high, seed):
    """Any shape past the small-input cut-off and any value range (keys of 1 to 63 columns): torch.unique's result."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, high, (n, c), generator=g)
    got, want = unique_rows(x), _reference(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_small_inputs_and_errors():
    """Below SMALL rows torch.unique itself answers; bad input is one clear error."""
    x = torch.tensor([[1, 2], [1, 2], [0, 3]])
    assert [t.tolist() for t in unique_rows(x)] == [[[0, 3], [1, 2]], [1, 1, 0]]
    with pytest.raises(ValueError, match="2-D integer"):
        unique_rows(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="2-D integer"):
        unique_rows(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="non-negative"):
        unique_rows(torch.full((SMALL, 2), -1))
