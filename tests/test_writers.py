"""Nothing lost (II): one writer per run or output folder (a lock the OS drops when its process dies), no output that
replaces an existing file without --overwrite, run folders outside their own corpus glob, corpus fingerprints checked
on --resume, and the messages around them. The concurrent runs are real processes (`python -m elmokit`); the first one
is held at a step by a wrapper so that the others surely start while it runs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
from safetensors.torch import load_file

from conftest import REPO_ROOT
from elmokit.cli import main as cli_main
from elmokit.config import elmo_tiny
from elmokit.errors import FolderInUseError, UsageError
from elmokit.io import LOCK_NAME, folder_lock, lock_folder
from elmokit.modules.bilm import BiLM
from elmokit.pretraining.data import corpus_changes, corpus_fingerprint
from elmokit.pretraining.run_folder import check_outside_patterns
from elmokit.weights.native import save_pretrained

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
LINES = "the river bank is muddy .\nthe money bank is closed .\na boat on the river .\n"

# Holds the writer lock of every folder named on the command line, says so, and waits (until killed or stdin closes).
HOLDER = r"""
import sys
from elmokit.io import lock_folder
locks = [lock_folder(f, "folder") for f in sys.argv[1:]]
print("held", flush=True)
sys.stdin.read()
"""

# `elmokit ARGS` whose training pauses after step PAUSE (writing READY) until GO exists: the run is surely live while
# the test starts the other writers, whatever the machine's speed.
PAUSED_TRAIN = r"""
import os, sys, time
from pathlib import Path
from elmokit.cli import main
from elmokit.pretraining.trainer import Trainer
ready, go, pause = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
real = Trainer.train_step
def step(self, batch):
    out = real(self, batch)
    if self.step == pause:
        ready.write_text(str(os.getpid()))
        deadline = time.time() + 120
        while not go.exists() and time.time() < deadline:
            time.sleep(0.02)
    return out
Trainer.train_step = step
sys.exit(main(sys.argv[4:]))
"""


@contextlib.contextmanager
def holding(*folders: Path):
    """A separate process holding the writer locks of ``folders``; yields its Popen (killed at the end)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *map(str, folders)],
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "held", proc.stderr.read()
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _err(capsys) -> str:
    return capsys.readouterr().err


def _train_args(corpus, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        str(corpus),
        "--out-dir",
        str(out),
        "--preset",
        "tiny",
        "--batch-size",
        "4",
        "--negatives",
        "0",
        "--log-every",
        "1",
        "--no-progress",
        *extra,
    ]


def _start_paused(tmp_path: Path, argv: list[str], pause: int):
    script = tmp_path / "paused_train.py"
    script.write_text(PAUSED_TRAIN, encoding="utf-8")
    ready, go = tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ready), str(go), str(pause), *argv],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1]
    return proc, go


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------------------------- the lock itself
def test_lock_refuses_a_second_writer_names_it_and_a_killed_holder_never_blocks(tmp_path):
    folder = tmp_path / "run"
    with holding(folder) as holder:
        with pytest.raises(FolderInUseError) as info:
            lock_folder(folder, "run folder")
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "started 20" in message and str(folder) in message
        assert "\n" not in message
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert (folder / LOCK_NAME).is_file()  # the killed holder's file stays, with its record, but unlocked
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == holder.pid
    with folder_lock(folder, "run folder") as lock:
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
        with folder_lock(folder, "run folder"):  # held again by the same process (the CLI, then the library)
            pass
        assert lock.held and (folder / LOCK_NAME).is_file()
    assert not (folder / LOCK_NAME).exists()  # a clean release removes it
    # a folder the lock created and nothing was written into is removed again; a file in the way is named
    with folder_lock(tmp_path / "new"):
        pass
    assert not (tmp_path / "new").exists()
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(UsageError, match="f.txt is a file"):
        lock_folder(tmp_path / "f.txt" / "run")


# ---------------------------------------------------------------------------------------------- train
def test_three_concurrent_writers_only_the_first_proceeds(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(LINES * 20)
    out = tmp_path / "R"
    first, go = _start_paused(
        tmp_path, _train_args(corpus, out, "--max-steps", "8", "--checkpoint-every", "2"), pause=4
    )
    before = sorted(p.name for p in out.glob("ckpt-*"))
    assert before == ["ckpt-2.safetensors", "ckpt-2.state.pt"]  # paused inside step 4, before its checkpoint
    # a --resume and an --overwrite run with another seed, started together while the first one runs
    others = [
        subprocess.Popen(
            [sys.executable, "-m", "elmokit", *argv], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for argv in (
            ["train", "--out-dir", str(out), "--resume", "--no-progress"],
            _train_args(corpus, out, "--seed", "7", "--overwrite", "--max-steps", "3"),
        )
    ]
    for proc in others:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 1, stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and "elmokit train: error:" in lines[0] and "is in use" in lines[0], stderr
        assert f"pid {first.pid}" in lines[0] and "started 20" in lines[0] and stdout == ""
    assert sorted(p.name for p in out.glob("ckpt-*")) == before  # --overwrite deleted nothing
    go.write_text("")
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    summary = json.loads(stdout)
    # the folder holds exactly the first run: its config, its 8 steps once each, its final loss, its model
    assert json.loads((out / "train_config.json").read_text())["seed"] == 0
    records = _metrics(out)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert summary["steps"] == 8 and abs(records[-1]["loss"] - summary["final_loss"]) <= 1e-6
    manifest = json.loads((out / "checkpoint.json").read_text())
    assert manifest["step"] == 8
    model, ckpt = load_file(str(out / "model" / "model.safetensors")), load_file(str(out / "ckpt-8.safetensors"))
    assert (model["softmax.weight"] == ckpt["softmax.weight"]).all()
    assert not (out / LOCK_NAME).exists()
    # the lock went with the run: the next writer proceeds
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--max-steps", "9", "--no-progress"]) == 0


def test_a_killed_run_does_not_block_its_resume_which_says_where_it_resumes(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(LINES * 20)
    out = tmp_path / "R"
    first, _ = _start_paused(tmp_path, _train_args(corpus, out, "--max-steps", "8", "--checkpoint-every", "3"), pause=4)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    assert (out / LOCK_NAME).is_file()  # stale: its process is gone
    assert cli_main(["train", "--out-dir", str(out), "--resume", "--max-steps", "5", "--no-progress"]) == 0
    err = _err(capsys)
    assert f"elmokit train: resumed from step 3 (checkpoint {out / 'ckpt-3.safetensors'}), training to step 5" in err
    assert [r["step"] for r in _metrics(out)] == [1, 2, 3, 4, 5]


def test_run_folder_inside_its_own_glob_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("corp").mkdir()
    Path("corp/a.txt").write_text(LINES * 4)
    assert cli_main(_train_args("corp/*", Path("corp"), "--max-steps", "1")) == 2
    err = _err(capsys)
    assert "training pattern 'corp/*'" in err and "corp/train_config.json" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in Path("corp").iterdir()) == ["a.txt"]  # nothing written
    assert cli_main(_train_args("corp/**/*.txt", Path("corp/run"), "--max-steps", "1")) == 2  # model/vocab.txt
    assert "corp/run/model/vocab.txt" in _err(capsys)
    assert cli_main(_train_args("corp/a.txt", Path("run"), "--max-steps", "1", "--valid-files", "*/*")) == 2
    assert "held-out pattern (--valid-files) '*/*'" in _err(capsys)
    assert not Path("run").exists()  # the folder the refused run would have used is not left behind
    # what glob would not match is fine: one level only, hidden names, another folder
    check_outside_patterns("corp/run", ["corp/*.txt", "corp/*"], "training pattern")  # corp/run/… is a level deeper
    check_outside_patterns("corp", ["corp/.*.txt", "other/*"], "training pattern")
    with pytest.raises(UsageError):
        check_outside_patterns(tmp_path / "corp", ["corp/ckpt-*"], "training pattern")  # relative vs absolute
    with pytest.raises(UsageError):
        check_outside_patterns("corp/x/run", ["corp/**"], "training pattern")


def test_run_folder_reached_through_a_symlinked_pattern_is_refused(tmp_path, capsys, monkeypatch):
    # 'lnk/*' with lnk -> real and --out-dir real: glob follows the link, so --resume read real/ckpt-*.safetensors
    # as corpus ("lnk/ckpt-2.safetensors:1: a NUL byte") before this check resolved the pattern's folders
    monkeypatch.chdir(tmp_path)
    Path("real").mkdir()
    Path("real/a.txt").write_text(LINES * 4)
    Path("lnk").symlink_to("real", target_is_directory=True)
    assert cli_main(_train_args("lnk/*", Path("real"), "--max-steps", "1")) == 2
    err = _err(capsys)
    assert "training pattern 'lnk/*'" in err and "real/train_config.json" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in Path("real").iterdir()) == ["a.txt"]  # nothing written
    with pytest.raises(UsageError):
        check_outside_patterns("real", ["lnk/**/*.txt"], "training pattern")
    check_outside_patterns("lnk/run", ["lnk/*.txt"], "training pattern")  # one level deeper: not matched


# ---------------------------------------------------------------------------------------------- fingerprints
def test_resume_names_an_edited_added_or_vanished_training_file(tmp_path, capsys):
    corp = tmp_path / "corp"
    corp.mkdir()
    (corp / "a.txt").write_text(LINES * 200)
    (corp / "b.txt").write_text(LINES * 5)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<S>\n</S>\n<UNK>\n" + "\n".join(sorted(set(LINES.split()))) + "\n")
    out = tmp_path / "R"
    pattern = str(corp / "*.txt")
    assert cli_main(_train_args(pattern, out, "--vocab", str(vocab), "--max-steps", "3")) == 0
    manifest = json.loads((out / "checkpoint.json").read_text())
    recorded = manifest["corpus"]["files"]
    assert recorded == corpus_fingerprint([corp / "a.txt", corp / "b.txt"])
    assert recorded[str(corp / "a.txt")]["size"] == len(LINES) * 200
    capsys.readouterr()
    resume = ["train", "--out-dir", str(out), "--resume", "--max-steps", "4", "--no-progress"]
    original = (corp / "a.txt").read_bytes()
    # `sed -i '1,500d'`: the saved position would now point into other text
    (corp / "a.txt").write_bytes(b"".join(original.splitlines(keepends=True)[500:]))
    assert cli_main(resume) == 1
    err = _err(capsys)
    assert f"{corp / 'a.txt'} was edited ({len(original)} bytes" in err and len(err.splitlines()) == 1
    assert "--overwrite" in err and "b.txt" not in err
    # same size, other bytes
    (corp / "a.txt").write_bytes(original.replace(b"river", b"rivet", 1))
    assert cli_main(resume) == 1 and "a.txt was edited" in _err(capsys)
    (corp / "a.txt").write_bytes(original)  # put back: a new mtime, the same bytes — fine
    (corp / "c.txt").write_text(LINES)
    assert cli_main(resume) == 1
    err = _err(capsys)
    assert f"{corp / 'c.txt'} was added" in err and "CorpusCursor" not in err and "vocabulary" not in err
    (corp / "c.txt").unlink()
    (corp / "b.txt").rename(tmp_path / "b.txt")
    assert cli_main(resume) == 1 and f"{corp / 'b.txt'} vanished" in _err(capsys)
    (tmp_path / "b.txt").rename(corp / "b.txt")
    assert cli_main(resume) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 4


def test_corpus_changes_compares_size_and_digest_not_mtime():
    a = {"size": 3, "mtime_ns": 1, "sha256": "x"}
    assert corpus_changes({"f": a}, {"f": {**a, "mtime_ns": 2}}) == []
    assert corpus_changes({"f": a}, {"f": {**a, "sha256": "y"}})[0].startswith("f was edited (the same size, 3 bytes")
    assert corpus_changes({"f": a}, {"f": a, "g": a}) == ["g was added (it matches the training patterns now)"]
    assert corpus_changes({"f": a, "g": a}, {"g": a}) == ["f vanished (the training patterns no longer match it)"]


# ---------------------------------------------------------------------------------------------- outputs
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("writers-model") / "m"
    save_pretrained(BiLM(elmo_tiny()), folder)
    return folder


def test_embed_and_similar_never_replace_a_text_file_without_overwrite(tmp_path, tiny_model, capsys):
    three = tmp_path / "three.txt"
    three.write_text("the bank .\nthe river bank .\nmoney in the bank .\n", encoding="utf-8")
    copy = tmp_path / "dev-copy.txt"
    copy.write_text("a text file of the user's\n", encoding="utf-8")
    assert cli_main(["embed", str(tiny_model), str(three), str(copy), "--no-progress"]) == 2
    err = _err(capsys)
    assert f"the output {copy} already exists: pass --overwrite" in err and len(err.splitlines()) == 1
    assert copy.read_text(encoding="utf-8") == "a text file of the user's\n"
    # --overwrite replaces only a file elmokit wrote: a user's text file is refused, one line, untouched
    assert cli_main(["embed", str(tiny_model), str(three), str(copy), "--no-progress", "--overwrite"]) == 2
    err = _err(capsys)
    assert "is not an HDF5 file of embeddings elmokit wrote" in err and "by hand" in err and len(err.splitlines()) == 1
    assert copy.read_text(encoding="utf-8") == "a text file of the user's\n"
    vectors = tmp_path / "vectors.h5"
    assert cli_main(["embed", str(tiny_model), str(three), str(vectors), "--no-progress"]) == 0
    assert cli_main(["embed", str(tiny_model), str(three), str(vectors), "--no-progress", "--overwrite"]) == 0
    assert h5py.is_hdf5(vectors)
    # the parts layout: a finished output folder is replaced only with --overwrite
    parts = tmp_path / "parts"
    assert cli_main(["embed", str(tiny_model), str(three), str(parts), "--format", "parts", "--no-progress"]) == 0
    assert cli_main(["embed", str(tiny_model), str(three), str(parts), "--format", "parts", "--no-progress"]) == 2
    assert "already holds finished embeddings: pass --overwrite" in _err(capsys)
    assert (
        cli_main(
            ["embed", str(tiny_model), str(three), str(parts), "--format", "parts", "--no-progress", "--overwrite"]
        )
        == 0
    )
    capsys.readouterr()
    # similar --png
    png = tmp_path / "plot.png"
    png.write_text("keep me\n")
    argv = ["similar", str(tiny_model), str(three), "--word", "bank", "--png", str(png)]
    assert cli_main(argv) == 2
    assert f"--png {png} already exists: pass --overwrite" in _err(capsys)
    assert cli_main(argv + ["--overwrite"]) == 2  # not a plot elmokit wrote
    assert "is not a plot elmokit wrote" in _err(capsys)
    assert png.read_text() == "keep me\n"
    png.unlink()
    assert cli_main(argv) == 0 and cli_main(argv + ["--overwrite"]) == 0  # its own plot: replaced
    assert png.read_bytes().startswith(b"\x89PNG")


def test_embed_refuses_a_parts_folder_another_process_writes(tmp_path, tiny_model, capsys):
    three = tmp_path / "three.txt"
    three.write_text("the bank .\n", encoding="utf-8")
    parts, single = tmp_path / "parts", tmp_path / "out.hdf5"
    with holding(parts, tmp_path / "out.hdf5.parts") as holder:
        for argv in (
            ["embed", str(tiny_model), str(three), str(parts), "--format", "parts"],
            ["embed", str(tiny_model), str(three), str(single), "--overwrite"],
        ):
            assert cli_main(argv + ["--no-progress"]) == 1
            err = _err(capsys)
            assert "is in use" in err and f"pid {holder.pid}" in err and len(err.splitlines()) == 1
    assert not single.exists() and not list(parts.glob("part-*"))


def test_zoo_build_and_quickstart_refuse_a_folder_in_use(tmp_path):
    from elmokit.recipes.quickstart import run_quickstart
    from elmokit.recipes.zoo.build import build_model, model_dir

    folder = model_dir("en", tmp_path / "cache")
    with holding(folder, tmp_path / "qs") as holder:
        with pytest.raises(FolderInUseError, match=f"pid {holder.pid}"):
            build_model("en", data_dir=tmp_path, cache=tmp_path / "cache", overwrite=True)
        with pytest.raises(FolderInUseError, match=f"pid {holder.pid}"):
            run_quickstart(tmp_path / "qs", steps=1, device="cpu")


# ---------------------------------------------------------------------------------------------- messages
def test_out_dir_below_a_file_and_valid_files_matching_nothing_are_named(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(LINES)
    assert cli_main(_train_args(corpus, corpus / "run")) == 2
    err = _err(capsys)
    assert f"--out-dir {corpus / 'run'} cannot be created: {corpus} is a file, not a folder" in err
    assert "Errno" not in err and len(err.splitlines()) == 1
    assert cli_main(_train_args(corpus, tmp_path / "R", "--valid-files", str(tmp_path / "held-*.txt"))) == 2
    err = _err(capsys)
    assert "--valid-files" in err and "held-*.txt" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "R").exists()


def test_export_inside_the_model_folder_is_refused(tiny_model, tmp_path, capsys):
    assert cli_main(["export", str(tiny_model), str(tiny_model / "sub")]) == 2
    err = _err(capsys)
    assert f"is inside the model folder {tiny_model}" in err and "no command writes inside a model folder" in err
    assert not (tiny_model / "sub").exists()


def test_convert_takes_a_model_folder_like_the_other_commands(tmp_path, capsys):
    from conftest import shared_path

    fx = shared_path("fixtures", "allennlp-elmo")
    assert cli_main(["convert", str(fx), str(tmp_path / "two")]) == 0
    assert cli_main(["convert", str(fx / "options.json"), str(fx / "lm_weights.hdf5"), str(tmp_path / "three")]) == 0
    two, three = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("two", "three"))
    assert two.keys() == three.keys() and all((two[k] == three[k]).all() for k in two)
    capsys.readouterr()
    assert cli_main(["convert", str(fx), str(tmp_path / "two")]) == 2
    assert "already holds a model" in _err(capsys)
    assert cli_main(["convert", str(tmp_path / "two"), str(tmp_path / "again")]) == 2
    assert "already in elmokit's format" in _err(capsys)
    assert cli_main(["convert", str(fx), str(tmp_path / "two" / "x"), str(tmp_path / "y"), str(tmp_path / "z")]) == 2
    assert "MODEL OUT or OPTIONS WEIGHTS OUT" in _err(capsys)
    original = tmp_path / "original"
    original.mkdir()
    for name in ("options.json", "lm_weights.hdf5"):
        (original / name).write_bytes((fx / name).read_bytes())
    assert cli_main(["convert", str(original), str(original / "native")]) == 2
    assert f"is inside the model folder {original}" in _err(capsys)
    assert cli_main(["convert", str(original / "options.json"), str(original / "lm_weights.hdf5"), str(original)]) == 2
    assert "holds the original model" in _err(capsys)
    assert sorted(p.name for p in original.iterdir()) == ["lm_weights.hdf5", "options.json"]


def test_an_edit_keeping_size_and_time_says_the_contents_differ():
    from elmokit.pretraining.data import corpus_changes

    before = {"a.txt": {"size": 10, "mtime_ns": 10**18, "sha256": "00"}}
    same_time = {"a.txt": {"size": 10, "mtime_ns": 10**18, "sha256": "11"}}
    assert corpus_changes(before, same_time) == [
        "a.txt was edited (the same size, 10 bytes, and modification time, but other contents: its sha256 differs)"
    ]
    later = {"a.txt": {"size": 12, "mtime_ns": 10**18 + 60 * 10**9, "sha256": "11"}}
    assert corpus_changes(before, later)[0].startswith("a.txt was edited (10 bytes, modified ")
