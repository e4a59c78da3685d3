"""What a command writes never destroys what the user had (issue 39, items 1 and 6): an output is never one of the
command's inputs (after symlinks and hard links), ``--overwrite`` replaces only a file elmokit wrote, and every
refusal is one line naming the flag or path the user typed."""

from __future__ import annotations

import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import shared_path
from elmokit import Embedder, load_pretrained_bilm
from elmokit.analysis.polysemy import is_elmokit_plot, plot_occurrences
from elmokit.cli import main as cli_main
from elmokit.embedding.reader import is_elmokit_embeddings
from elmokit.errors import UsageError
from elmokit.export.files import is_elmokit_export
from elmokit.io import check_output_path, same_file

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def native1(tmp_path_factory) -> Path:
    """``elmokit convert ../shared/fixtures/allennlp-elmo native1``, as the issue's new user did."""
    out = tmp_path_factory.mktemp("model") / "native1"
    assert cli_main(["convert", str(shared_path("fixtures", "allennlp-elmo")), str(out)]) == 0
    return out


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    return err


def _embed(model: Path, *args: str | Path) -> int:
    return cli_main(["embed", str(model), *map(str, args), "--no-progress"])


# ---------------------------------------------------------------------------------------------- item 1: no data loss
def test_embed_never_writes_over_its_cache_vocab(native1, tmp_path, capsys, monkeypatch):
    (tmp_path / "s.txt").write_text("the bank .\n")
    cv = tmp_path / "cv.txt"
    cv.write_text("the\nbank\n")
    monkeypatch.chdir(tmp_path)  # the command, relative paths as typed
    assert _embed(native1, "s.txt", "cv.txt", "--cache-vocab", "cv.txt", "--overwrite") == 2
    err = _one_error_line(capsys)
    assert "cv.txt is the --cache-vocab file" in err
    assert cv.read_text() == "the\nbank\n"


def test_embed_overwrite_refuses_a_users_text_file(native1, tmp_path, capsys):
    (tmp_path / "s.txt").write_text("the bank .\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert _embed(native1, tmp_path / "s.txt", notes, "--overwrite") == 2
    err = _one_error_line(capsys)
    assert "notes.txt exists and is not an HDF5 file of embeddings elmokit wrote" in err and "by hand" in err
    assert notes.read_text() == "my notes\n"
    foreign = tmp_path / "foreign.h5"  # an HDF5 file, but not one elmokit wrote
    with h5py.File(foreign, "w") as h5:
        h5["x"] = np.arange(3)
    before = foreign.read_bytes()
    assert _embed(native1, tmp_path / "s.txt", foreign, "--overwrite") == 2
    assert "is not an HDF5 file of embeddings elmokit wrote" in _one_error_line(capsys)
    assert foreign.read_bytes() == before
    # the library keeps the same rule: overwrite=True does not turn a text file into HDF5
    with pytest.raises(UsageError, match="is not an HDF5 file of embeddings elmokit wrote"):
        Embedder(load_pretrained_bilm(native1)).embed_file(tmp_path / "s.txt", notes, overwrite=True, progress=False)
    assert notes.read_text() == "my notes\n"


def test_embed_refuses_links_to_its_inputs(native1, tmp_path, capsys):
    sentences = tmp_path / "s.txt"
    sentences.write_text("the bank .\n")
    cv = tmp_path / "cv.txt"
    cv.write_text("bank\n")
    (tmp_path / "hard.txt").hardlink_to(sentences)
    (tmp_path / "sym.h5").symlink_to(sentences)
    (tmp_path / "cv-link.h5").hardlink_to(cv)
    (tmp_path / "weights.h5").hardlink_to(native1 / "model.safetensors")
    cases = {
        "hard.txt": "is the input file (a link to it)",
        "sym.h5": "is the input file (a link to it)",
        "cv-link.h5": "is the --cache-vocab file (a link to it)",
        "weights.h5": "model folder's file model.safetensors (a link to it)",
    }
    weights = (native1 / "model.safetensors").read_bytes()
    for name, words in cases.items():
        assert _embed(native1, sentences, tmp_path / name, "--cache-vocab", cv, "--overwrite") == 2, name
        assert words in _one_error_line(capsys), name
    assert sentences.read_text() == "the bank .\n" and cv.read_text() == "bank\n"
    assert (native1 / "model.safetensors").read_bytes() == weights


@pytest.mark.parametrize("fmt", ["hdf5", "allennlp"])
def test_embed_overwrite_replaces_its_own_output(native1, tmp_path, capsys, fmt):
    (tmp_path / "s.txt").write_text("the bank .\n")
    (tmp_path / "t.txt").write_text("a river bank .\n")
    out = tmp_path / "o.h5"
    assert _embed(native1, tmp_path / "s.txt", out, "--format", fmt) == 0
    assert is_elmokit_embeddings(out)
    assert _embed(native1, tmp_path / "t.txt", out, "--format", fmt) == 2  # no --overwrite: refused
    assert "pass --overwrite" in _one_error_line(capsys)
    assert _embed(native1, tmp_path / "t.txt", out, "--format", fmt, "--overwrite") == 0
    with h5py.File(out, "r") as h5:
        assert h5["0"].shape == (3, 4, 32)  # (L+1, tokens, 2P): the second file's four tokens


def test_an_output_from_before_the_writer_attribute_is_recognised(tmp_path):
    """Files written before the ``writer`` attribute carry ``keys`` (every format) and ``elmokit_format`` (hdf5)."""
    old = tmp_path / "old.h5"
    with h5py.File(old, "w") as h5:
        h5.attrs["keys"] = "line"
        h5["0"] = np.zeros((3, 1, 4), np.float32)
    assert is_elmokit_embeddings(old)
    (tmp_path / "text.h5").write_text("keys line\n")
    assert not is_elmokit_embeddings(tmp_path / "text.h5") and not is_elmokit_embeddings(tmp_path / "missing.h5")


def test_check_output_path_rules(tmp_path):
    """The central helper: same file by inode (a hard link, a symlink), a folder input protecting its files."""
    a = tmp_path / "a.txt"
    a.write_text("x")
    (tmp_path / "b.txt").hardlink_to(a)
    assert same_file(a, tmp_path / "b.txt") and not same_file(a, tmp_path / "c.txt")
    never = lambda path: pytest.fail("ours() asked about an input")  # noqa: E731
    for out in (a, tmp_path / "b.txt"):
        with pytest.raises(UsageError, match="is the input"):
            check_output_path(out, {"input": a}, overwrite=True, ours=never, kind="k")
    (tmp_path / "m").mkdir()
    with pytest.raises(UsageError, match="is inside the model folder"):
        check_output_path(
            tmp_path / "m" / "new.h5", {"model folder": tmp_path / "m"}, overwrite=True, ours=never, kind="k"
        )
    yes = lambda path: True  # noqa: E731
    check_output_path(tmp_path / "new.h5", {"input": a, "unused": None}, overwrite=False, ours=yes, kind="k")
    with pytest.raises(UsageError, match="is not k: --overwrite replaces only a file elmokit wrote"):
        check_output_path(tmp_path / "b.txt", {}, overwrite=True, ours=lambda path: False, kind="k")


def test_similar_png_follows_the_same_rules(native1, tmp_path, capsys):
    sentences = tmp_path / "b.txt"
    sentences.write_text("the bank of the river .\nthe bank lent money .\n")
    base = ["similar", str(native1), str(sentences), "--word", "bank"]
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"\x89PNG\r\n\x1a\n not elmokit's")
    assert cli_main([*base, "--png", str(mine), "--overwrite"]) == 2
    assert "is not a plot elmokit wrote" in _one_error_line(capsys)
    assert mine.read_bytes() == b"\x89PNG\r\n\x1a\n not elmokit's"
    (tmp_path / "s.png").symlink_to(sentences)
    assert cli_main([*base, "--png", str(tmp_path / "s.png"), "--overwrite"]) == 2
    assert "is the sentences file (a link to it)" in _one_error_line(capsys)
    assert cli_main([*base, "--png", str(tmp_path / "p.png")]) == 0
    capsys.readouterr()
    assert is_elmokit_plot(tmp_path / "p.png")
    assert cli_main([*base, "--png", str(tmp_path / "p.png"), "--overwrite"]) == 0  # its own plot: replaced


# ---------------------------------------------------------------------------------------------- item 6: messages
def test_plots_are_written_in_the_format_asked(tmp_path, native1, capsys):
    vectors = np.random.default_rng(0).normal(size=(4, 3, 8))
    signatures = {"png": b"\x89PNG\r\n\x1a\n", "svg": b"<?xml", "pdf": b"%PDF-"}
    for fmt, signature in signatures.items():
        path = plot_occurrences(vectors, tmp_path / f"bank.{fmt.upper() if fmt == 'pdf' else fmt}")
        assert path.read_bytes().startswith(signature), fmt
        assert is_elmokit_plot(path), fmt
    with pytest.raises(UsageError, match=r"\.png, \.svg or \.pdf"):
        plot_occurrences(vectors, tmp_path / "bank.jpg")
    sentences = tmp_path / "b.txt"
    sentences.write_text("the bank of the river .\nthe bank lent money .\n")
    assert cli_main(["similar", str(native1), str(sentences), "--word", "bank", "--png", str(tmp_path / "b.jpg")]) == 2
    assert "--png" in _one_error_line(capsys) and not (tmp_path / "b.jpg").exists()


def test_embed_errors_name_the_flag_and_the_path(native1, tmp_path, capsys):
    (tmp_path / "s.txt").write_text("the bank .\n")
    assert _embed(native1, tmp_path / "s.txt", tmp_path / "o.h5", "--layers", "5") == 2
    err = _one_error_line(capsys)
    assert "--layers 5 is not a layer of this model" in err and "layers=" not in err
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    for args in (["/proc/o.h5"], ["/proc/o", "--format", "parts"]):
        assert _embed(native1, tmp_path / "s.txt", *args) == 2
        err = _one_error_line(capsys)
        assert f"the output {args[0]} cannot be written: its folder /proc is not writable" in err, err
        assert ".parts" not in err and "Errno" not in err


def test_export_to_an_existing_unwritable_folder_says_so(native1, tmp_path, capsys):
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    assert cli_main(["export", str(native1), "/proc/x.onnx", "--format", "onnx"]) == 2
    err = _one_error_line(capsys)
    assert "/proc is not writable" in err and "cannot be made" not in err
    user = tmp_path / "x.onnx"
    user.write_text("not an export\n")
    assert cli_main(["export", str(native1), str(user), "--format", "onnx", "--overwrite"]) == 2
    assert "is not a program elmokit exported" in _one_error_line(capsys)
    assert user.read_text() == "not an export\n" and not is_elmokit_export(user)


def test_train_never_writes_over_its_vocab(tmp_path, capsys):
    """``--vocab`` inside --out-dir where the run writes its vocab.txt (the same path, or a hard link there)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the bank .\n")
    vocab_text = "<S>\n</S>\n<UNK>\nthe\nbank\n.\n"
    (tmp_path / "run" / "model").mkdir(parents=True)
    inside = tmp_path / "run" / "model" / "vocab.txt"
    inside.write_text(vocab_text)
    mine = tmp_path / "mine.txt"
    mine.write_text(vocab_text)
    (tmp_path / "run2" / "model").mkdir(parents=True)
    (tmp_path / "run2" / "model" / "vocab.txt").hardlink_to(mine)
    base = ["train", str(corpus), "--preset", "tiny", "--max-steps", "1", "--no-progress", "--overwrite"]
    for run, vocab in (("run", inside), ("run2", mine)):
        assert cli_main([*base, "--out-dir", str(tmp_path / run), "--vocab", str(vocab)]) == 2
        err = _one_error_line(capsys)
        assert "model/vocab.txt is the --vocab file" in err and "another --out-dir" in err
        assert vocab.read_text() == vocab_text


def test_exports_are_recognised_by_their_metadata(tmp_path):
    """A ``.pt2`` zip holding ``<root>/extra/elmokit.json`` is an export elmokit wrote; another zip is not."""
    ours, other = tmp_path / "m.pt2", tmp_path / "other.pt2"
    with zipfile.ZipFile(ours, "w") as zf:
        zf.writestr("m/extra/elmokit.json", '{"format": "elmokit-export"}')
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("m/data.pkl", "x")
    assert is_elmokit_export(ours) and not is_elmokit_export(other)
    onnx_like = tmp_path / "m.onnx"
    onnx_like.write_bytes(b"\x08\x07graph..." + b'{"format": "elmokit-export", "version": 1}')
    assert is_elmokit_export(onnx_like)
