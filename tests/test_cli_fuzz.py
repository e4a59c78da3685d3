"""Fuzzing the command line in-process: for every command, arbitrary option values and paths (missing files,
folders, odd unicode, NUL characters, negative and huge numbers, empty strings, files of the wrong kind) must end in
exit status 0, 1 or 2 with a one-line ``error:`` message — never an ``internal error`` or a traceback.

Each example runs in a fresh copy of a small world (a tiny native model, a 2-step tiny LM, text files good and bad,
an HDF5 file, an options.json, a folder that is not a model) and with that copy as the current folder, so generated
relative output paths land there. Released model names (``small``, ``original`` …) are among the model arguments:
the network is replaced by one that fails as offline machines do, and the download must fail cleanly (exit 1).
Training is bounded by a ``--max-steps`` of at most 2 appended to every ``train`` command, and ``quickstart`` runs
on a few sentences with the tiny architecture with ``--steps 1`` appended, so no example trains for long.

The examples are derandomised (the same on every run, so CI is stable); ``ELMOKIT_FUZZ_RANDOM=1`` draws new ones and
``ELMOKIT_FUZZ_EXAMPLES=N`` changes how many per command.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from elmokit.cli import main as cli_main
from elmokit.config import elmo_tiny
from elmokit.modules.bilm import BiLM
from elmokit.weights.native import save_pretrained

_EXAMPLES = int(os.environ.get("ELMOKIT_FUZZ_EXAMPLES", "0") or 0)


def _settings(n: int):
    return settings(
        max_examples=_EXAMPLES or n,
        deadline=None,
        database=None,
        derandomize=os.environ.get("ELMOKIT_FUZZ_RANDOM") != "1",
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The files every example starts from (copied afresh for each example)."""
    from elmokit.pretraining.trainer import TrainConfig, Trainer

    w = tmp_path_factory.mktemp("world")
    save_pretrained(BiLM(elmo_tiny()), w / "model")
    (w / "good.txt").write_text("the river bank .\n\nthe money bank .\n", encoding="utf-8")
    Trainer(
        TrainConfig(
            train_files=[str(w / "good.txt")],
            out_dir=str(w / "lm"),
            model=elmo_tiny().to_options(),
            batch_size=4,
            n_negative_samples=0,
            max_steps=2,
            progress=False,
        )
    ).train()
    (w / "latin1.txt").write_bytes("a caf\xe9 b\n".encode("latin-1"))
    (w / "bom.txt").write_text("\ufeffa b\n", encoding="utf-8")
    (w / "empty.txt").write_text("")
    (w / "blank.txt").write_text("\n\n \n")
    (w / "odd-ünï 名.txt").write_text("苹果 公司 \u200b 😀\n", encoding="utf-8")
    with h5py.File(w / "weights.hdf5", "w") as h5:
        h5["x"] = np.zeros(3)
    (w / "options.json").write_text((w / "model" / "config.json").read_text())
    (w / "bad.json").write_text("{not json")
    (w / "list.json").write_text("[1, 2]")
    (w / "dir").mkdir()
    (w / "dir" / "readme.txt").write_text("not a model")
    return w


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    """No network: downloads fail as on an offline machine; an empty download cache."""
    from elmokit.weights import native

    def no_network(url):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(native, "_urlopen", no_network)
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))


_ODD = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/"), max_size=12)
_EXISTING_INPUTS = [
    "good.txt",
    "latin1.txt",
    "bom.txt",
    "empty.txt",
    "blank.txt",
    "odd-ünï 名.txt",
    "weights.hdf5",
    "options.json",
    "bad.json",
    "list.json",
    "dir",
    "model",
    "lm/model",
    "lm",
    "model/config.json",
    "nope.txt",
    "",
    ".",
    "-",
    "*.txt",
    "/dev/null",
    "/",
    "a\0b",
]
_GOOD_INPUTS = ["good.txt", "bom.txt", "blank.txt", "odd-ünï 名.txt"]
#: input paths: mostly the world's files and folders, also missing ones and arbitrary names (relative to the copy)
inputs = st.one_of(
    st.sampled_from(_GOOD_INPUTS), st.sampled_from(_GOOD_INPUTS), st.sampled_from(_EXISTING_INPUTS), _ODD
)
#: output paths: relative only (every write stays inside the world copy)
outputs = st.one_of(
    st.sampled_from(["out.h5", "new-folder", "out.h5"]),
    st.sampled_from(
        ["out.h5", "good.txt", "model", "model/v.h5", "dir", "lm/model", "new/dir/x", "", ".", "weights.hdf5", "a\0b"]
    ),
    _ODD.filter(lambda s: not s.startswith("/")),
)
models = st.one_of(
    st.just("model"),
    st.just("lm/model"),
    st.sampled_from(
        [
            "model",
            "lm/model",
            "dir",
            "lm",
            "good.txt",
            "weights.hdf5",
            "nope",
            "",
            "small",
            "ORIGINAL",
            "original-5.5b",
            "medium",
        ]
    ),
    _ODD,
)
numbers = st.one_of(
    st.integers(1, 6).map(str),
    st.integers(1, 6).map(str),
    st.integers(-3, 5).map(str),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(["0", "-0", "1e3", "1e999", "nan", "inf", "-inf", "0.5", "1e-300", "", "x", "9" * 5000]),
    _ODD,
)
devices = st.one_of(
    st.sampled_from(["cpu", "auto"]),
    st.sampled_from(["cpu", "auto", "cuda", "cuda:7", "mps", "tpu", "", "CPU", "cuda:-1", "cpu:0", "meta"]),
    _ODD,
)
decode = st.one_of(st.sampled_from(["strict", "replace", "ignore", "skip"]), _ODD)


def _options(draw, pairs: dict) -> list[str]:
    """A random subset of ``--flag value`` pairs (or bare flags for value None), in random order."""
    chosen = draw(st.lists(st.sampled_from(sorted(pairs)), unique=True, max_size=len(pairs)))
    argv: list[str] = []
    for flag in chosen:
        argv.append(flag)
        if pairs[flag] is not None:
            argv.append(draw(pairs[flag]))
    return argv


def _with_global_flags(draw, argv: list[str]) -> list[str]:
    where = draw(st.sampled_from(["none", "before", "after"]))
    if where == "before":
        return ["-v", *argv]
    if where == "after":
        return [*argv, "--verbose"]
    return argv


@st.composite
def embed_argv(draw):
    argv = ["embed", draw(models), draw(inputs), draw(outputs)]
    argv += _options(
        draw,
        {
            "--layers": st.one_of(st.sampled_from(["all", "top", "average"]), _ODD),
            "--batch-size": numbers,
            "--device": devices,
            "--decode-errors": decode,
            "--no-progress": None,
        },
    )
    return _with_global_flags(draw, argv)


@st.composite
def models_argv(draw):
    command = draw(st.sampled_from(["convert", "export", "info"]))
    if command == "convert":
        argv = ["convert", draw(inputs), draw(inputs), draw(outputs)]
    elif command == "export":
        argv = ["export", draw(models), draw(outputs)]
    else:
        argv = ["info", draw(models)]
    if command != "info" and draw(st.booleans()):
        argv.append("--overwrite")
    return _with_global_flags(draw, argv)


@st.composite
def lm_file_argv(draw):
    lm = st.one_of(st.sampled_from(["lm/model", "lm/model", "model", "lm", "good.txt", "nope", ""]), _ODD)
    argv = [draw(st.sampled_from(["perplexity", "score"])), draw(lm), draw(inputs)]
    argv += _options(draw, {"--batch-size": numbers, "--decode-errors": decode})
    return _with_global_flags(draw, argv)


def _mostly(valid) -> st.SearchStrategy:
    """Valid values three times in four, so that examples get past the first check and into the command."""
    return st.one_of(valid, valid, valid, numbers)


@st.composite
def train_argv(draw):
    files = draw(
        st.lists(
            st.one_of(st.just("good.txt"), st.just("good.txt"), inputs),
            min_size=draw(st.sampled_from([0, 1, 1, 1])),
            max_size=2,
        )
    )
    argv = [
        "train",
        *files,
        "--out-dir",
        draw(st.one_of(st.sampled_from(["run", "run", "lm", "good.txt", "dir", ""]), outputs)),
    ]
    small = st.integers(1, 6).map(str)
    options = {
        "--preset": st.sampled_from(["tiny", "tiny", "tiny", "nonesuch", ""]),
        "--options": inputs,
        "--vocab": inputs,
        "--min-count": _mostly(small),
        "--max-vocab": _mostly(st.integers(3, 20).map(str)),
        "--char-vocab": None,
        "--batching": st.sampled_from(["sentences", "windows", "x"]),
        "--batch-size": _mostly(small),
        "--unroll-steps": _mostly(small),
        "--epochs": _mostly(small),
        "--optimizer": st.sampled_from(["adagrad", "adam", "sgd"]),
        "--lr": _mostly(st.sampled_from(["0.01", "1e-3", "0.5", "1e5"])),
        "--clip-norm": _mostly(st.sampled_from(["0.1", "1", "10", "1e30"])),
        "--dropout": _mostly(st.sampled_from(["0", "0.1", "0.5", "0.99"])),
        "--negatives": _mostly(small),
        "--seed": _mostly(st.integers(0, 2**32 - 1).map(str)),
        "--checkpoint-every": _mostly(small),
        "--checkpoint-minutes": _mostly(st.sampled_from(["1e-9", "0.01", "30"])),
        "--keep-checkpoints": _mostly(small),
        "--log-every": _mostly(small),
        "--device": devices,
        "--nondeterministic": None,
        "--decode-errors": decode,
        "--resume": None,
        "--overwrite": None,
    }
    chosen = draw(st.lists(st.sampled_from(sorted(options)), unique=True, max_size=6))
    for flag in chosen:
        argv.append(flag)
        if options[flag] is not None:
            argv.append(draw(options[flag]))
    if "--preset" not in argv and "--options" not in argv:
        argv += ["--preset", "tiny"]  # the default preset (small) would train a 13M-parameter model
    argv += ["--no-progress", "--max-steps", str(draw(st.integers(1, 2)))]  # last: bounds every run
    return _with_global_flags(draw, argv)


@st.composite
def quickstart_argv(draw):
    argv = ["quickstart", "--out-dir", draw(st.one_of(st.sampled_from(["qs", "dir", "good.txt", ".", ""]), outputs))]
    argv += _options(draw, {"--minutes": numbers, "--steps": numbers, "--seed": numbers, "--device": devices})
    return _with_global_flags(draw, [*argv, "--steps", "1"])  # last: one training step


def _run(world: Path, argv: list[str], capsys) -> None:
    capsys.readouterr()
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "w"
        shutil.copytree(world, copy)
        os.chdir(copy)
        try:
            status = cli_main(argv)
        finally:
            os.chdir(here)
    out, err = capsys.readouterr()
    assert status in (0, 1, 2), (argv, status, err)
    assert "internal error" not in err and "Traceback" not in err, (argv, err)
    if status:
        assert " error: " in err, (argv, err)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    event(f"exit {status}: {' '.join(last.split(' error: ')[-1].split()[:3]) if status else 'ok'}")


@given(argv=embed_argv())
@_settings(40)
def test_fuzz_embed(world, offline, capsys, argv):
    _run(world, argv, capsys)


@given(argv=models_argv())
@_settings(40)
def test_fuzz_convert_export_info(world, offline, capsys, argv):
    _run(world, argv, capsys)


@given(argv=lm_file_argv())
@_settings(30)
def test_fuzz_perplexity_and_score(world, capsys, argv):
    _run(world, argv, capsys)


@given(argv=train_argv())
@_settings(25)
def test_fuzz_train(world, capsys, argv):
    _run(world, argv, capsys)


@given(argv=quickstart_argv())
@_settings(10)
def test_fuzz_quickstart(world, monkeypatch, capsys, argv):
    from elmokit.recipes.quickstart import en as quickstart

    sentences = [
        s.split()
        for s in (
            "The river bank was muddy .",
            "She took money to the bank .",
            "A boat drifted down the river .",
            "The bank raised its rates .",
        )
    ]
    monkeypatch.setattr(quickstart, "load_lee_corpus", lambda: (sentences * 3, sentences[:2]))
    monkeypatch.setattr(quickstart, "quickstart_config", elmo_tiny)
    _run(world, argv, capsys)
