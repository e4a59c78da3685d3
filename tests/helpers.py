"""Loading the reference fixture models (../shared/fixtures) for tests."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from conftest import shared_path
from elmokit import load_original

FIXTURE_SETS = {
    "allennlp-elmo": ("fixtures", "allennlp-elmo", "sentences.json"),
    "bilm-tf": ("fixtures", "bilm-tf", "model", "lm_embeddings_sentences.json"),
}


def fixture_dir(name: str):
    return shared_path(*FIXTURE_SETS[name][:-1])


def fixture_model(name: str, **kwargs):
    d = fixture_dir(name)
    return load_original(d / "options.json", d / "lm_weights.hdf5", **kwargs).eval()


def fixture_sentences(name: str) -> list[list[str]]:
    return json.loads(shared_path(*FIXTURE_SETS[name]).read_text())


def expected_top(name: str, k: int, i: int) -> np.ndarray:
    """(n_tokens, 32): [forward; backward] top layer of sentence i of list k."""
    with h5py.File(fixture_dir(name) / f"lm_embeddings_{k}.hdf5", "r") as fh:
        e = fh[str(i)][...]
    return np.concatenate([e[0], e[1]], axis=-1)


def clipping_lstm(
    dim: int,
    projection_dim: int,
    n_layers: int,
    cell_clip: float,
    proj_clip: float,
    use_skip_connections: bool,
    seed: int,
):
    """A random BiLM LSTM stack whose weights are scaled ×4, large enough that both clips fire."""
    import torch

    from elmokit.config import LSTMConfig
    from elmokit.modules.lstm import BiLSTM

    torch.manual_seed(seed)
    lstm = BiLSTM(
        LSTMConfig(
            dim=dim,
            projection_dim=projection_dim,
            n_layers=n_layers,
            cell_clip=cell_clip,
            proj_clip=proj_clip,
            use_skip_connections=use_skip_connections,
        )
    )
    with torch.no_grad():
        for w in list(lstm.weight_ih) + list(lstm.weight_hh) + list(lstm.weight_proj):
            w.mul_(4.0)
    return lstm


def tiny_random_bilm(seed: int = 0, *, stateful: bool = False, lstm_dims: tuple[int, int] = (16, 8)):
    """A very small random-weight BiLM (byte scheme, C = 50) for fast property tests: filters (1,4) (2,4) (3,8),
    char dim 4, 1 highway layer, 2 LSTM layers of ``lstm_dims`` = (cells, projection), (16, 8) by default (output
    16). Eval mode."""
    import torch

    from elmokit import BiLM, CharCNNConfig, ElmoConfig, LSTMConfig
    from elmokit.modules.bilm import StatefulBiLM

    config = ElmoConfig(
        char_cnn=CharCNNConfig(filters=[(1, 4), (2, 4), (3, 8)], n_highway=1, embedding_dim=4),
        lstm=LSTMConfig(
            dim=lstm_dims[0],
            projection_dim=lstm_dims[1],
            n_layers=2,
            cell_clip=3.0,
            proj_clip=3.0,
            use_skip_connections=True,
        ),
    )
    torch.manual_seed(seed)
    model = BiLM(config).eval()
    with torch.no_grad():  # non-zero biases so that padding mistakes would show
        for p in model.parameters():
            if p.dim() == 1 or (p.dim() == 2 and p.shape[0] == 2):
                p.uniform_(-0.5, 0.5)
    return StatefulBiLM(model) if stateful else model


#: A small character model for training tests (1 highway layer, 10 characters a token): ~5 ms a step.
TINY_TRAIN_OPTIONS = {
    "lstm": {
        "dim": 16,
        "projection_dim": 8,
        "n_layers": 2,
        "cell_clip": None,
        "proj_clip": None,
        "use_skip_connections": True,
    },
    "char_cnn": {
        "embedding": {"dim": 4},
        "filters": [[1, 8], [2, 8], [3, 16]],
        "n_highway": 1,
        "n_characters": 261,
        "max_characters_per_token": 10,
        "activation": "tanh",
    },
}
#: Words of the tiny training corpora.
TINY_WORDS = "the a cat dog sat ran on under mat tree big small red fast slowly quietly".split()


def write_tiny_corpus(folder: Path) -> Path:
    """24 lines of 3 to 7 :data:`TINY_WORDS` in a fixed pattern → ``folder/train.txt`` (returned)."""
    lines = [" ".join(TINY_WORDS[(7 * i + 3 * j) % len(TINY_WORDS)] for j in range(3 + i % 5)) for i in range(24)]
    (folder / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / "train.txt"


def tiny_window_config(corpus: Path, out: Path, **changes):
    """A 12-step stream-window run of :data:`TINY_TRAIN_OPTIONS` on ``corpus`` (checkpoints every 4 steps, 6 sampled
    negatives, every step logged), with ``changes`` applied: a :class:`~elmokit.pretraining.TrainConfig`."""
    from elmokit.pretraining.trainer import TrainConfig

    base = dict(
        train_files=[str(corpus)],
        out_dir=str(out),
        model=TINY_TRAIN_OPTIONS,
        batching="windows",
        batch_size=2,
        unroll_steps=5,
        n_epochs=100,
        max_steps=12,
        n_negative_samples=6,
        dropout=0.1,
        clip_norm=1.0,
        seed=0,
        checkpoint_every=4,
        log_every=1,
        progress=False,
    )
    base.update(changes)
    return TrainConfig(**base)


def assert_close_to_scale(got, want, tol: float, *, equal_nan: bool = False, dim: int | None = None) -> None:
    """Assert ``|got - want| <= tol * max(1, |want|)`` elementwise: ``tol`` absolute for values up to 1, relative
    above. float32 results computed in another order (another kernel, another CPU's vector width, a batch of another
    size) differ by a few units in the last place of the values summed, so an absolute bound alone holds only for the
    magnitudes it was tried on (a highway layer fed 1e6 gives values near 1e4, where one float32 step is 0.001).
    With ``dim``, the scale is the largest finite ``|want|`` along that dimension instead of each value: a sum's
    rounding is relative to the size of the terms summed, which a value that is small by cancellation understates.
    Tensors or arrays; with ``equal_nan``, NaN matches NaN; infinities must match exactly."""
    import torch

    got = torch.as_tensor(got).detach().double().cpu()
    want = torch.as_tensor(want).detach().double().cpu()
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    finite = torch.isfinite(want) & torch.isfinite(got)
    same = (got == want) | (equal_nan & torch.isnan(got) & torch.isnan(want))
    assert bool((finite | same).all()), f"non-finite values differ at {(~(finite | same)).nonzero()[:5].tolist()}"
    diff = torch.where(finite, (got - want).abs(), torch.zeros_like(got))
    scale = torch.where(torch.isfinite(want), want.abs(), torch.zeros_like(want))
    if dim is not None:
        scale = scale.amax(dim=dim, keepdim=True).expand_as(want)
    allowed = tol * scale.clamp(min=1.0)
    ratio = torch.where(finite, diff / allowed, torch.zeros_like(got))
    if ratio.numel() and float(ratio.max()) > 1:
        i = int(ratio.argmax())
        raise AssertionError(
            f"{int((ratio > 1).sum())} of {ratio.numel()} values differ by more than {tol:g} x "
            f"max(1, |value|); worst at flat index {i}: got {float(got.flatten()[i])!r}, want "
            f"{float(want.flatten()[i])!r} (difference {float(diff.flatten()[i]):.3g})"
        )


def docs_example(page: str, heading: str) -> str:
    """The first ```python block after the heading ``heading`` (e.g. ``"## spaCy"``) of the documentation page
    ``docs/<page>``: the examples the integration tests run (the page marks them skipped for its own snippet test)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text(encoding="utf-8")
    start = text.index("\n" + heading + "\n")
    block = text.index("```python\n", start) + len("```python\n")
    return text[block : text.index("```", block)]
