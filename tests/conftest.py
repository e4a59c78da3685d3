"""Shared test helpers: locating ``../shared`` beside the repository root; a one-thread fixture for tiny models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import elmokit  # noqa: F401  (before torch: elmokit's OpenMP wait setting, see elmokit.modules.threads, applies here too)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


def shared_path(*parts: str) -> Path:
    """Return a path under ``../shared``; skip the test when it is absent.

    With ``ELMOKIT_REQUIRE_SHARED=1`` (set by ``.ci/run``) a missing file fails the test instead of skipping.
    """
    path = SHARED.joinpath(*parts)
    if not path.exists():
        msg = f"{path} not found: the shared data/fixtures folder must sit beside the repository"
        skip_unless_required(msg, "SHARED")
    return path


def skip_unless_required(msg: str, what: str) -> None:
    """Skip the test with ``msg``, or fail it when ``ELMOKIT_REQUIRE_<what>=1`` (``.ci/run`` sets SHARED, NATIVE and
    BROWSER: there a missing prerequisite is a failure, on a user's machine a skip)."""
    if os.environ.get(f"ELMOKIT_REQUIRE_{what}") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


#: The seed every module and every test starts from (torch, numpy and random's global generators).
TEST_SEED = 0


def _seed_global_rngs() -> None:
    import random

    import numpy as np
    import torch

    random.seed(TEST_SEED)
    np.random.seed(TEST_SEED)
    torch.manual_seed(TEST_SEED)


@pytest.fixture(scope="module", autouse=True)
def _seeded_module():
    """A module's fixtures start from the same global random state whatever ran before (a random model built by a
    module fixture is the same model in any order)."""
    _seed_global_rngs()


@pytest.fixture(autouse=True)
def _seeded_test():
    """Each test starts from the same global random state whatever ran before it: ``BiLM(...)``, ``torch.randn``
    and ``np.random`` without an explicit generator give the same values alone and in any order (issue 39 item 9)."""
    _seed_global_rngs()


def _native_or_skip(module, what: str):
    """``module`` when it is there; else a failure under ``ELMOKIT_REQUIRE_NATIVE=1`` (set by ``.ci/run``), a skip
    elsewhere (a machine without a C++ compiler, or ``ELMOKIT_NATIVE=0``)."""
    if module is None:
        if os.environ.get("ELMOKIT_REQUIRE_NATIVE") == "1":
            pytest.fail(f"ELMOKIT_REQUIRE_NATIVE=1 but the {what} could not be built or loaded (see the log)")
        pytest.skip(f"{what} unavailable here (no C++ compiler or ninja, or ELMOKIT_NATIVE=0)")
    return module


@pytest.fixture(scope="module")
def kernels():
    """The native inference kernels (:func:`elmokit.modules.native.kernels`)."""
    from elmokit.modules import native  # lazy: imports torch, after elmokit's OpenMP setting above

    return _native_or_skip(native.kernels(), "native kernels")


@pytest.fixture(scope="module")
def train_kernels():
    """The fused training layer's native ops (:func:`elmokit.modules.native.train_ops`)."""
    from elmokit.modules import native  # lazy: imports torch, after elmokit's OpenMP setting above

    return _native_or_skip(native.train_ops(), "native training kernels")


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests with one torch thread: tiny models are several times faster on one thread than on two
    on a busy 2-core machine, and give the same numbers in every run."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the test order's seed (pytest-random-order; ``-q`` hides its header line), so that an order-dependent
    failure can be repeated: ``python -m pytest --random-order-seed=N``."""
    bucket = getattr(config.option, "random_order_bucket", None)
    seed = getattr(config.option, "random_order_seed", None)
    if bucket is None or seed is None or bucket.removeprefix("default:") == "none":
        return
    terminalreporter.write_line(
        f"test order: --random-order-bucket={bucket.removeprefix('default:')} "
        f"--random-order-seed={seed.removeprefix('default:')} (repeat it with these options)"
    )
