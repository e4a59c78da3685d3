"""NUL and control bytes in input lines (issue 19, item 5): one rule, the same in every command.

Observed before: a NUL byte in any input line made ``embed`` end in ``internal error: ValueError: VLEN strings do not
support embedded NULLs`` after the part's work (all three layouts; also a binary file with ``--decode-errors
replace``); the leftover parts folder blocked a rerun and ``--resume`` crashed the same way; ``score``, ``train`` and
``similar`` accepted the same file. The rule (``elmokit.data.corpus.line_problem``): a line must be valid UTF-8 and
hold no NUL byte; a bad line stops the command before any work, naming file:line:column, unless ``--decode-errors``
replaces (U+FFFD), drops (ignore) or skips it; every other control character is kept."""

from __future__ import annotations

import json

import h5py
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmokit import Embedder
from elmokit.cli import main as cli_main
from elmokit.config import elmo_tiny
from elmokit.data.corpus import CorpusDecodeError, decode_line, line_problem, read_lines
from elmokit.embedding.reader import open_embeddings, work_folder
from elmokit.modules.bilm import BiLM
from elmokit.pretraining.objective import BidirectionalLM
from elmokit.pretraining.trainer import save_lm
from elmokit.vocabulary import Vocabulary

NUL_FILE = b"the river bank\nthe \x00bank lends\n\xef\xbb\xbfok line\n"
LAYOUTS = ["hdf5", "allennlp", "parts"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("nul")
    save_lm(BidirectionalLM(elmo_tiny(), Vocabulary(["<S>", "</S>", "<UNK>", "the", "bank"]), dropout=0.0), root / "lm")
    return root / "lm"


def test_line_problem_names_the_first_problem():
    assert line_problem(b"plain text\n") is None
    assert line_problem("苹果 \t\x01\x1b[31m\x7f\u0085\n".encode()) is None  # other control characters are text
    assert line_problem(b"ab\x00c") == "a NUL byte at column 3 (binary data, or UTF-16 text?)"
    assert line_problem(b"a\xffb\x00") == "invalid UTF-8 (byte 0xff at column 2: invalid start byte)"
    assert line_problem(b"\x00a\xff").startswith("a NUL byte at column 1")
    # UTF-16 text read as UTF-8: every ASCII character followed by NUL
    assert "NUL byte at column 2" in line_problem("hi".encode("utf-16-le"))


def test_decode_line_modes():
    raw = b"a\x00b \xff c\n"
    with pytest.raises(CorpusDecodeError, match=r"f\.txt:7: a NUL byte at column 2"):  # the first problem
        decode_line(raw, "strict", "f.txt", 7)
    assert decode_line(raw, "replace", "f.txt", 7) == ("a\ufffdb \ufffd c\n", True)
    assert decode_line(raw, "ignore", "f.txt", 7) == ("ab  c\n", True)
    assert decode_line(raw, "skip", "f.txt", 7) == (None, True)
    assert decode_line(b"fine\n", "strict", "f.txt", lambda: 1 / 0) == ("fine\n", False)  # no line count needed


def test_read_lines_applies_the_rule(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(NUL_FILE)
    with pytest.raises(CorpusDecodeError, match=r"in\.txt:2: a NUL byte at column 5"):
        read_lines(path)
    assert read_lines(path, "skip") == [(1, "the river bank"), (3, "\ufeffok line")]
    assert read_lines(path, "replace")[1] == (2, "the \ufffdbank lends")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_embed_refuses_a_nul_byte_before_any_work_in_every_layout(model, tmp_path, capsys, layout):
    inp = tmp_path / "in.txt"
    inp.write_bytes(NUL_FILE)
    out = tmp_path / ("out" if layout == "parts" else "out.h5")
    args = ["embed", str(model), str(inp), str(out), "--format", layout, "--no-progress", "--part-size", "1"]
    assert cli_main(args) == 1
    err = capsys.readouterr().err
    assert "in.txt:2: a NUL byte at column 5" in err and "--decode-errors" in err and "internal error" not in err
    # nothing written: no output, no parts folder to block a rerun; --resume says the same
    assert not out.exists() and not work_folder(out, layout).exists()
    assert cli_main(args + ["--resume"]) == 1
    assert "in.txt:2: a NUL byte" in capsys.readouterr().err
    # stored by the written rule with --decode-errors replace (U+FFFD) or skip (an empty dataset)
    assert cli_main(args + ["--decode-errors", "replace"]) == 0
    with open_embeddings(out) as emb:
        assert len(emb) == 3 and emb.sentence(1) == "the \ufffdbank lends" and emb["1"].shape[1] == 3
    capsys.readouterr()
    assert cli_main(args + ["--decode-errors", "skip", "--overwrite"]) == 0  # replaces the output just written
    assert "1 undecodable line(s) skipped" in capsys.readouterr().out
    with open_embeddings(out) as emb:
        assert emb["1"].shape[1] == 0 and emb["2"].shape[1] == 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_binary_file_with_replace_and_sentence_keys(model, tmp_path, layout):
    inp = tmp_path / "bin.txt"
    inp.write_bytes(bytes(b for b in range(256) if b != 10) * 3 + b"\n\x00\x00\n")  # two lines
    out = tmp_path / ("o" if layout == "parts" else "o.h5")
    emb = Embedder(model, batch_size=2)
    assert emb.embed_file(inp, out, format=layout, decode_errors="replace", progress=False) == 2
    emb.embed_file(
        inp, tmp_path / f"k-{layout}", format="parts", decode_errors="replace", progress=False, use_sentence_keys=True
    )
    with open_embeddings(tmp_path / f"k-{layout}") as keyed:
        assert "\ufffd\ufffd" in keyed


def test_an_interrupted_run_of_an_older_version_resumes_into_the_clear_error(model, tmp_path, capsys):
    """A parts folder left by the old crash is not touched: --resume stops at the NUL line, before any work."""
    inp = tmp_path / "in.txt"
    inp.write_bytes(NUL_FILE)
    out = tmp_path / "out.h5"
    parts = work_folder(out, "hdf5")
    parts.mkdir()
    (parts / "index.json").write_text("{}")
    assert cli_main(["embed", str(model), str(inp), str(out), "--resume", "--no-progress"]) == 1
    assert "in.txt:2: a NUL byte" in capsys.readouterr().err
    assert (parts / "index.json").read_text() == "{}"


@pytest.mark.parametrize("command", ["score", "perplexity", "train", "similar"])
def test_every_command_reading_text_refuses_the_same_file(model, tmp_path, capsys, command):
    inp = tmp_path / "in.txt"
    inp.write_bytes(NUL_FILE)
    argv = {
        "score": ["score", str(model), str(inp)],
        "perplexity": ["perplexity", str(model), str(inp)],
        "train": [
            "train",
            str(inp),
            "--out-dir",
            str(tmp_path / "run"),
            "--preset",
            "tiny",
            "--max-steps",
            "1",
            "--no-progress",
        ],
        "similar": ["similar", str(model), str(inp), "--word", "bank"],
    }[command]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert "in.txt:2: a NUL byte at column 5" in err and "--decode-errors" in err and "internal error" not in err
    if command == "score":
        assert cli_main(argv + ["--decode-errors", "replace"]) == 0
        lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [x["line"] for x in lines] == [1, 2, 3] and lines[1]["sentence"] == "the \ufffdbank lends"


def test_the_python_api_names_its_own_argument(model, tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_bytes(NUL_FILE)
    with pytest.raises(CorpusDecodeError, match=r"errors= \(decode_errors=\) 'replace'") as info:
        Embedder(model).embed_file(inp, tmp_path / "o.h5", progress=False)
    assert "--decode-errors" not in str(info.value)


any_bytes = st.binary(min_size=1, max_size=2).map(lambda b: b.replace(b"\n", b"").decode("latin-1"))
control_line = st.lists(
    st.one_of(
        st.sampled_from(
            ["a", "b", " ", "\t", "\x00", "\x01", "\x1b", "\x7f", "\x85", "\x1c", "\u2028", "\ufeff", "\r", "é", "苹"]
        ),
        any_bytes,
    ),
    min_size=0,
    max_size=8,
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(control_line, min_size=1, max_size=4),
    layout=st.sampled_from(LAYOUTS),
    mode=st.sampled_from(["strict", "replace", "skip"]),
    raw_bytes=st.booleans(),
)
def test_any_control_bytes_are_stored_or_refused_by_the_rule(tmp_path_factory, lines, layout, mode, raw_bytes):
    """Whatever bytes a line holds, embed either stores it (its stripped text in the sentences) or refuses it by the
    rule; never an internal error."""
    tmp = tmp_path_factory.mktemp("fuzz")
    data = b"".join(("".join(parts)).encode("latin-1" if raw_bytes else "utf-8", "replace") + b"\n" for parts in lines)
    inp = tmp / "in.txt"
    inp.write_bytes(data)
    out = tmp / ("o" if layout == "parts" else "o.h5")
    bad = [i + 1 for i, raw in enumerate(data.split(b"\n")[:-1]) if line_problem(raw) is not None]
    emb = Embedder(BiLM(elmo_tiny()), batch_size=2)
    if bad and mode == "strict":
        with pytest.raises(CorpusDecodeError, match=rf"in\.txt:{bad[0]}: "):
            emb.embed_file(inp, out, format=layout, progress=False, part_size=2)
        assert not out.exists() and not work_folder(out, layout).exists()
        return
    assert emb.embed_file(inp, out, format=layout, progress=False, part_size=2, decode_errors=mode) == len(lines)
    expected = []
    for i, raw in enumerate(data.split(b"\n")[:-1]):
        text = decode_line(raw, mode, "x", 0)[0] or ""
        expected.append((text[1:] if i == 0 and text.startswith("\ufeff") else text).strip())
    with open_embeddings(out) as got:
        assert len(got) == len(lines)
        if layout != "allennlp":
            assert [got.sentence(i) for i in range(len(lines))] == expected
    if layout != "parts":
        with h5py.File(out, "r") as h5:
            assert all(str(i) in h5 for i in range(len(lines)))


def test_a_vocabulary_with_a_nul_byte_and_a_utf16_file_are_named(tmp_path):
    """Found by trying it as a new user: a --vocab file with a NUL inside a word was accepted; a UTF-16 file's
    message did not say UTF-16."""
    from elmokit.errors import DataError
    from elmokit.vocabulary import Vocabulary

    vocab = tmp_path / "v.txt"
    vocab.write_bytes(b"<S>\n</S>\n<UNK>\nthe\nba\0nk\n")
    with pytest.raises(DataError, match=r"v\.txt:5: a NUL byte in vocabulary file at column 3"):
        Vocabulary.from_file(vocab)
    assert "a UTF-16 byte-order mark: save the file as UTF-8" in line_problem("bank\n".encode("utf-16"))
    assert "byte-order mark" not in line_problem(b"\xffbank\n")
