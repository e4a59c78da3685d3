"""Messages and cosmetics (issue 19, item 8): each observation reproduced, each now says what to do.

* ``Embedder.embed_file(..., workers=2)`` in a script without an ``if __name__ == "__main__":`` guard printed a
  traceback per worker and then "rerun with --resume", which could never work;
* ``Elmo`` on a character-vocabulary model given byte ids said "char_ids must have shape (B, T, 10)" and no more;
* an empty input was exit 1 for ``perplexity``/``train`` and exit 2 for ``similar``;
* CLI messages named Python arguments ("resume=True");
* ``similar`` printed cosines to 3 digits (1.000 everywhere for a weak model); each PCA panel was autoscaled; the
  CJK plot title was drawn as code points.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import Elmo, Embedder, InputError, UsageError, batch_to_ids, save_pretrained
from elmokit.analysis import polysemy
from elmokit.characters import CharVocabulary
from elmokit.cli import main as cli_main
from elmokit.config import elmo_tiny
from elmokit.embedding.reader import work_folder
from elmokit.modules.bilm import BiLM
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.pretraining.trainer import save_lm
from elmokit.vocabulary import Vocabulary

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("messages") / "lm"
    save_lm(BidirectionalLM(elmo_tiny(), Vocabulary(["<S>", "</S>", "<UNK>", "a", "bank"]), dropout=0.0), folder)
    return folder


# ---------------------------------------------------------------------------------------------- workers, no guard
def test_embed_file_with_workers_in_an_unguarded_script_names_the_guard(lm_folder, tmp_path):
    (tmp_path / "in.txt").write_text("a bank\nthe bank\na\n", encoding="utf-8")
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(f"""\
        from elmokit import Embedder
        Embedder({str(lm_folder)!r}).embed_file({str(tmp_path / "in.txt")!r}, {str(tmp_path / "out.h5")!r},
                                                 workers=2, part_size=1, progress=False)
        """),
        encoding="utf-8",
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1
    # one traceback (the script's own uncaught error), none from the workers; the guard named; no --resume advice
    assert done.stderr.count("Traceback") == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("elmokit.errors.UsageError: the worker processes could not start")
    assert f"the script {script}" in last and 'if __name__ == "__main__":' in last and "embed_file(workers=2)" in last
    assert "resume" not in done.stderr
    # nothing was finished, so nothing is left to block the corrected script
    assert not (tmp_path / "out.h5").exists() and not work_folder(tmp_path / "out.h5", "hdf5").exists()


# ---------------------------------------------------------------------------------------------- Elmo char ids
def test_byte_ids_for_a_character_vocabulary_model_say_how_to_make_its_ids():
    cfg = elmo_tiny()
    chars = CharVocabulary(list("苹果公司"), max_characters_per_token=10)
    config = dataclasses.replace(
        cfg, char_cnn=dataclasses.replace(cfg.char_cnn, max_characters_per_token=10, char_vocab_size=chars.vocab_size)
    )
    bilm = BiLM(config)
    bilm.char_vocab = chars
    elmo = Elmo(None, None, 1, module=bilm, dropout=0.0)
    with pytest.raises(
        InputError,
        match=r"shape \(B, T, 10\), got \(1, 2, 50\); this model's ids come from "
        r"batch_to_ids\(sentences, 10, char_vocab=elmo\.bilm\.char_vocab\)",
    ):
        elmo(batch_to_ids([["苹果", "公司"]]))
    assert elmo(batch_to_ids([["苹果", "公司"]], 10, char_vocab=elmo.bilm.char_vocab))["mask"].all()
    # the other way round: a byte model given character-vocabulary ids
    with pytest.raises(InputError, match=r"come from batch_to_ids\(sentences\) \(UTF-8 bytes, no char_vocab\)"):
        Elmo(None, None, 1, module=BiLM(elmo_tiny()), dropout=0.0)(batch_to_ids([["苹果"]], 10, char_vocab=chars))


# ---------------------------------------------------------------------------------------------- empty input
def test_an_input_without_sentences_is_exit_1_in_every_command(lm_folder, tmp_path, capsys):
    """A file that is there but holds nothing to read is a data problem (exit 1), like invalid UTF-8 in it."""
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n", encoding="utf-8")
    runs = {
        "perplexity": ["perplexity", str(lm_folder), str(blank)],
        "train": ["train", str(blank), "--out-dir", str(tmp_path / "run"), "--preset", "tiny", "--no-progress"],
        "similar": ["similar", str(lm_folder), str(blank), "--word", "bank"],
        "similar --corpus": [
            "similar",
            str(lm_folder),
            str(tmp_path / "s.txt"),
            "--word",
            "bank",
            "--corpus",
            str(blank),
        ],
    }
    (tmp_path / "s.txt").write_text("a bank\n", encoding="utf-8")
    for name, argv in runs.items():
        assert cli_main(argv) == 1, name
        err = capsys.readouterr().err
        assert re.search(r"holds no sentence|no sentences in", err) and "internal error" not in err, (name, err)


# ---------------------------------------------------------------------------------------------- CLI wording
def test_cli_messages_name_flags_and_python_messages_name_arguments(lm_folder, tmp_path, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("a bank\n", encoding="utf-8")
    out = tmp_path / "out.h5"
    work_folder(out, "hdf5").mkdir()
    (work_folder(out, "hdf5") / "index.json").write_text("{}")  # an interrupted run's parts
    assert cli_main(["embed", str(lm_folder), str(inp), str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "rerun with --resume to continue it" in err and "resume=True" not in err
    with pytest.raises(UsageError, match="rerun with resume=True to continue it") as info:
        Embedder(lm_folder).embed_file(inp, out, progress=False)
    assert "--resume" not in str(info.value)
    (tmp_path / "bad.txt").write_bytes(b"a \xff\n")
    assert cli_main(["perplexity", str(lm_folder), str(tmp_path / "bad.txt")]) == 1
    err = capsys.readouterr().err
    assert "--decode-errors replace, ignore or skip" in err and "errors=" not in err


# ---------------------------------------------------------------------------------------------- similar
def test_similar_prints_four_digits(tmp_path, capsys):
    torch.manual_seed(0)
    model = save_pretrained(BiLM(elmo_tiny()), tmp_path / "m")
    (tmp_path / "s.txt").write_text(
        "money\tthe bank lends\nriver\tthe river bank\nmoney\ta bank loan\nriver\ta grassy bank\n", encoding="utf-8"
    )
    assert cli_main(["similar", str(model), str(tmp_path / "s.txt"), "--word", "bank", "--labels"]) == 0
    out = capsys.readouterr().out
    matrix = re.findall(r"^  #1 +(-?\d\.\d+) +(-?\d\.\d+) +(-?\d\.\d+) +(-?\d\.\d+)$", out, flags=re.M)
    assert matrix and all(len(v.split(".")[1]) == 4 for row in matrix for v in row)
    summary = [line for line in out.splitlines() if line.startswith("2 ")][0].split()
    assert len(summary) == 8 and all(re.fullmatch(r"[-+]?\d\.\d{4}", v) for v in summary[2:])  # mean … gap


def test_plot_scale_is_shared_and_in_cosine_units():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(1, 3, 16))
    v = np.repeat(base, 6, axis=0) + 1e-3 * rng.normal(size=(6, 3, 16))  # layers 0, 1: cosines > 0.999
    v[:, 2] = rng.normal(size=(6, 16)) * 50  # layer 2: unrelated vectors, large norms
    coords, limit = polysemy.plot_scale(v, [0, 1, 2, "average"])
    assert limit == 1.0  # unit-length vectors: the shared axis runs from -1 to 1 here
    assert max(np.abs(coords[0]).max(), np.abs(coords[1]).max()) < 0.01  # one tight blob, not autoscaled clusters
    assert np.abs(coords[2]).max() > 0.3
    # distances in a panel never exceed the unit vectors' distance sqrt(2 - 2 cos)
    x = v[:, 2] / np.linalg.norm(v[:, 2], axis=1, keepdims=True)
    for i in range(6):
        for j in range(6):
            assert np.linalg.norm(coords[2][i] - coords[2][j]) <= np.linalg.norm(x[i] - x[j]) + 1e-9


def test_cjk_plot_text_without_a_cjk_font_is_romanised_and_said(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(polysemy, "cjk_font", lambda chars: None)
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING, logger="elmokit.analysis.polysemy"):
        polysemy.plot_occurrences(
            rng.normal(size=(4, 2, 8)), tmp_path / "p.png", ["水果", "公司"] * 2, title="苹果: 4 occurrences"
        )
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert "romanises it (pingguo: 4 occurrences)" in caplog.text and "fonts-noto-cjk" in caplog.text
    assert polysemy.romanised("苹果 bank, 모델", {"苹", "果", "모", "델"}) == "pingguo bank, U+BAA8U+B378"


def test_cjk_plot_text_with_a_cjk_font_is_drawn(tmp_path, caplog):
    font = polysemy.cjk_font(polysemy.missing_glyphs("苹果水果公司"))
    if font is None:
        pytest.skip("no CJK font on this machine (e.g. Debian's fonts-noto-cjk): the romanised path is tested above")
    rng = np.random.default_rng(0)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        polysemy.plot_occurrences(
            rng.normal(size=(4, 2, 8)), tmp_path / "p.png", ["水果", "公司"] * 2, title="苹果: 4 occurrences"
        )
    assert "romanis" not in caplog.text
    assert not [w for w in caught if "missing from font" in str(w.message)]  # matplotlib's missing-glyph warning
