"""Atomic writes: an interrupted write leaves the old file (or none); finished files get the umask's permissions."""

import os
import stat

import pytest

from elmokit.io import atomic_path, atomic_write_text


def test_interrupted_write_keeps_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write_text(target, "old\n")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_path(target) as tmp:
            tmp.write_text("half of the new cont")
            raise RuntimeError("boom")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_written_file_has_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
