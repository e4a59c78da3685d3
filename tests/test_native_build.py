"""One native build per environment (elmokit/modules/native.py): the build's name separates environments, builds are
serialised by a file lock, and only a finished build is ever loaded. The compiler is replaced by a stand-in that writes
a file, so these tests take milliseconds; ``bench/native_build.py`` measures the real thing across two environments."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from elmokit.modules import native


def test_build_name_separates_environments_and_compilers(monkeypatch):
    first = native.build_name()
    assert native.build_name() == first  # stable within an environment
    monkeypatch.setattr(sys, "prefix", "/somewhere/else/.venv")
    other_env = native.build_name()
    assert other_env != first and other_env.startswith("elmokit_native_")
    monkeypatch.setenv("CXX", "clang++")
    assert native.build_name() not in (first, other_env)


class FakeCompiler:
    """Stands in for ``torch.utils.cpp_extension.load``: writes ``<folder>/<name>.so`` (after ``delay`` seconds) and
    counts the builds; importing a library returns a marker object naming it."""

    def __init__(self, monkeypatch, root: Path, delay: float = 0.0):
        from torch.utils import cpp_extension

        self.builds = 0
        self.delay = delay
        self.root = root
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
        monkeypatch.delenv("ELMOKIT_NATIVE", raising=False)
        monkeypatch.setattr(cpp_extension, "load", self.load)
        monkeypatch.setattr(native, "_import_library", lambda name, library: SimpleNamespace(__file__=str(library)))

    def load(self, name, sources, **kwargs):
        self.builds += 1
        time.sleep(self.delay)
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        library = folder / f"{name}.so"
        library.write_bytes(b"compiled " + name.encode())
        return SimpleNamespace(__file__=str(library))


def test_a_finished_build_is_loaded_and_an_unfinished_one_rebuilt(monkeypatch, tmp_path):
    fake = FakeCompiler(monkeypatch, tmp_path)
    assert native._load() is not None and fake.builds == 1
    assert native.status()["state"] == "built now"
    library = Path(native.status()["path"])
    assert (library.parent / native.MARKER_NAME).is_file()
    for _ in range(3):  # later imports in this environment: no build
        assert native._load() is not None
    assert fake.builds == 1 and native.status() == {"state": "loaded", "path": str(library)}
    # a build killed half-way: a library the marker does not vouch for (here: cut short) is built again, not loaded
    library.write_bytes(b"comp")
    native._load()
    assert fake.builds == 2 and native.status()["state"] == "built now"
    (library.parent / native.MARKER_NAME).unlink()  # killed between the library and its marker
    native._load()
    assert fake.builds == 3


def test_two_environments_keep_their_own_build(monkeypatch, tmp_path):
    fake = FakeCompiler(monkeypatch, tmp_path)
    for _ in range(3):  # alternating, as two projects on one machine do
        for prefix in ("/envs/a", "/envs/b"):
            monkeypatch.setattr(sys, "prefix", prefix)
            native._load()
    assert fake.builds == 2
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2


def test_two_processes_starting_at_once_build_once(monkeypatch, tmp_path):
    """flock locks belong to open file descriptions, so two threads each opening the lock file contend exactly as two
    processes do."""
    fake = FakeCompiler(monkeypatch, tmp_path, delay=0.3)
    states = []
    threads = [threading.Thread(target=lambda: (native._load(), states.append(native.status()["state"]))) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.builds == 1 and sorted(states) in (["built now", "loaded"], ["loaded", "loaded"])


def test_off_and_unavailable_are_reported(monkeypatch):
    monkeypatch.setenv("ELMOKIT_NATIVE", "0")
    assert native._load() is None and native.status() == {"state": "off"}


@pytest.fixture(autouse=True)
def _restore_status():
    before = native.status()
    yield
    native._status = before
