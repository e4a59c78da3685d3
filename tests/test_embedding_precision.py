"""bf16 inference is opt-in (``Embedder(..., precision="bf16")``, ``elmokit embed --precision bf16``): float32 stays the
default, bf16 stays within its documented bound of float32 on the original's fixture model, and the choice is recorded
so that a resumed embedding never mixes the two."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from elmokit import Embedder
from elmokit.cli import main as cli_main
from elmokit.errors import UsageError
from elmokit.weights.native import save_pretrained
from helpers import fixture_model, fixture_sentences

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bilm():
    return fixture_model("allennlp-elmo")


def test_fp32_is_the_default_and_bf16_stays_within_its_bound(bilm):
    sentences = fixture_sentences("allennlp-elmo")[:12]
    default, fp32, bf16 = Embedder(bilm), Embedder(bilm, precision="fp32"), Embedder(bilm, precision="bf16")
    assert default.precision == "fp32"
    for a, b, c in zip(default.embed_batch(sentences), fp32.embed_batch(sentences), bf16.embed_batch(sentences)):
        np.testing.assert_array_equal(a, b)
        assert c.dtype == np.float32 and c.shape == a.shape
        for k in range(a.shape[0]):  # the bound the Embedder docstring and docs/how-to/bf16.md state: 2e-2 of the scale
            scale = float(np.abs(a[k]).max())
            err = float(np.abs(a[k] - c[k]).max())
            assert 0 < err <= 2e-2 * scale, (k, err, scale)


def test_a_sentence_alone_equals_it_in_a_padded_batch_in_bf16(bilm):
    sentences = fixture_sentences("allennlp-elmo")[:6]
    e = Embedder(bilm, precision="bf16")
    batch = e.embed_batch(sentences)
    for s, got in zip(sentences, batch):
        alone = e.embed_sentence(s)
        scale = float(np.abs(alone).max())
        assert float(np.abs(alone - got).max()) <= 1e-2 * scale


def test_bad_precision_is_one_line(bilm):
    with pytest.raises(UsageError, match=r"^Embedder precision must be 'fp32' or 'bf16', got 'half'$"):
        Embedder(bilm, precision="half")


def test_embed_precision_is_recorded_and_fixed_for_a_resume(bilm, tmp_path, capsys):
    model = tmp_path / "model"
    save_pretrained(bilm, model)
    text = tmp_path / "in.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in fixture_sentences("allennlp-elmo")[:5]), encoding="utf-8")
    out32, out16 = tmp_path / "fp32.hdf5", tmp_path / "bf16.hdf5"
    assert cli_main(["embed", str(model), str(text), str(out32), "--no-progress"]) == 0
    assert cli_main(["embed", str(model), str(text), str(out16), "--precision", "bf16", "--no-progress"]) == 0
    with h5py.File(out32) as a, h5py.File(out16) as b:
        assert "precision" not in a.attrs and b.attrs["precision"] == "bf16"
        for key in ("0", "2"):
            x, y = a[key][...], b[key][...]
            assert 0 < float(np.abs(x - y).max()) <= 2e-2 * float(np.abs(x).max())
    # parts written in bf16 are not resumed in fp32
    parts = tmp_path / "parts"
    args = ["embed", str(model), str(text), str(parts), "--format", "parts", "--no-progress"]
    assert cli_main([*args, "--precision", "bf16"]) == 0
    capsys.readouterr()
    code = cli_main([*args, "--resume"])
    assert code != 0 and "precision" in capsys.readouterr().err
