"""The suite's own rules (issue 39 item 9): every module passes alone and in any order. Runs are in random order
(pytest-random-order, configured in pyproject.toml), and each test starts from the same global random state, so a
test's random inputs (``torch.randn``, a ``BiLM``'s initial weights) never depend on what ran before it."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, TEST_SEED

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomli, a core dependency there
    import tomli as tomllib


def test_runs_are_in_random_order():
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "--random-order-bucket=module" in config["tool"]["pytest"]["ini_options"]["addopts"]
    assert any(d.startswith("pytest-random-order") for d in config["project"]["optional-dependencies"]["test"])


@pytest.mark.parametrize("consume", [0, 1, 5])
def test_each_test_starts_from_the_same_random_state(consume):
    """Whatever the test before it drew (here: the previous parametrisation consumes some numbers after checking),
    a test's first draws are those of the fixed seed."""
    want = torch.rand(3, generator=torch.Generator().manual_seed(TEST_SEED))
    assert torch.equal(torch.rand(3), want)
    assert np.random.rand() == np.random.RandomState(TEST_SEED).rand()
    assert random.random() == random.Random(TEST_SEED).random()
    torch.rand(consume)  # leave the generators elsewhere for the next test
    np.random.rand(consume)
