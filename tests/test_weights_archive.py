"""Model zips (the NLPL repository's layout): elmokit.weights.archive through load_pretrained_bilm, Embedder,
Elmo.from_pretrained and the CLI (embed, info, convert)."""

from __future__ import annotations

import gzip
import io
import json
import stat
import tempfile
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmokit import Elmo, Embedder, batch_to_ids, load_pretrained_bilm
from elmokit.cli import main as cli_main
from elmokit.errors import MissingFileError, UsageError, WeightsError
from elmokit.weights.archive import is_model_archive
from elmokit.weights.native import save_pretrained
from elmokit.weights.original import export_original
from helpers import tiny_random_bilm

SENTENCES = [["the", "cat", "sat", "on", "the", "mat", "."], ["Привет", "мир"], ["x"]]
VOCAB = ["<S>", "</S>", "<UNK>", "the", "cat", ".", "mat"]
META = {"id": 209, "corpus": [{"language": "eng", "description": "tiny test corpus"}], "dimensions": 16}


def nlpl_folder(folder: Path, *, n_characters: int = 262, padded_char_embed: bool = False, seed: int = 3) -> Path:
    """An exported tiny model laid out as an NLPL zip's content: options.json (``n_characters`` 261 — with bilm-tf's
    training keys, as a training options file — or 262),
    model.hdf5, vocab.txt, meta.json. ``padded_char_embed``: char_embed stored with its zero padding row (262 rows)."""
    model = tiny_random_bilm(seed)
    model.config.char_cnn.n_characters = n_characters
    export_original(model, folder, weights_name="model.hdf5")
    if n_characters == 261:  # a training options file, as bilm-tf writes it: its training keys too
        options = json.loads((folder / "options.json").read_text())
        options.update(bidirectional=True, n_tokens_vocab=len(VOCAB), n_negative_samples_batch=8192, unroll_steps=20)
        options["lstm"]["dropout"] = 0.1
        (folder / "options.json").write_text(json.dumps(options))
    if padded_char_embed:
        with h5py.File(folder / "model.hdf5", "r+") as fh:
            rows = fh["char_embed"][...]
            del fh["char_embed"]
            fh.create_dataset("char_embed", data=np.concatenate([np.zeros_like(rows[:1]), rows]))
    (folder / "vocab.txt").write_text("".join(w + "\n" for w in VOCAB), encoding="utf-8")
    (folder / "meta.json").write_text(json.dumps(META), encoding="utf-8")
    return folder


def make_zip(folder: Path, out: Path, *, top: str | None = None, names: list[str] | None = None) -> Path:
    """Zip ``folder``'s files (or only ``names``) at the root, or under ``top/``."""
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.iterdir()):
            if names is None or path.name in names:
                zf.write(path, f"{top}/{path.name}" if top else path.name)
    return out


def vectors(bilm) -> list[np.ndarray]:
    return list(Embedder(bilm).embed_sentences(SENTENCES))


@pytest.mark.parametrize(
    "n_characters, padded", [(261, False), (262, False), (262, True)], ids=["261", "262", "262-padded-table"]
)
def test_zip_of_an_exported_model_gives_the_folders_vectors(tmp_path, n_characters, padded):
    folder = nlpl_folder(tmp_path / "m", n_characters=n_characters, padded_char_embed=padded)
    with h5py.File(folder / "model.hdf5", "r") as fh:
        assert fh["char_embed"].shape[0] == (262 if padded else 261)
    assert json.loads((folder / "options.json").read_text())["char_cnn"]["n_characters"] == n_characters
    from_folder = load_pretrained_bilm(folder)
    for zipped in (make_zip(folder, tmp_path / "root.zip"), make_zip(folder, tmp_path / "top.zip", top="ru_elmo")):
        from_zip = load_pretrained_bilm(zipped)
        assert from_zip.config.char_cnn.n_characters == n_characters
        for (name, a), b in zip(from_zip.state_dict().items(), from_folder.state_dict().values()):
            assert torch.equal(a, b), name
        for got, want in zip(vectors(from_zip), vectors(from_folder)):
            assert np.array_equal(got, want)
        assert from_zip.source_meta == META and from_zip.source_vocab == VOCAB
        assert from_zip.source_archive == str(zipped)
    # and the export is the model itself: the same vectors as the random model it was written from
    for got, want in zip(vectors(from_folder), vectors(tiny_random_bilm(3))):
        assert np.array_equal(got, want)


def test_gz_vocabulary_no_meta_and_a_zip_not_named_zip(tmp_path):
    folder = nlpl_folder(tmp_path / "m")
    (folder / "vocab.txt.gz").write_bytes(gzip.compress("<S>\n</S>\n<UNK>\nдом\n\n".encode()))
    zipped = make_zip(folder, tmp_path / "model.bin", names=["options.json", "model.hdf5", "vocab.txt.gz"])
    assert is_model_archive(zipped) and not is_model_archive(folder / "model.hdf5")
    model = load_pretrained_bilm(zipped)
    assert model.source_vocab == ["<S>", "</S>", "<UNK>", "дом"] and model.source_meta is None


def test_several_hdf5_take_model_hdf5(tmp_path):
    folder = nlpl_folder(tmp_path / "m")
    other = tiny_random_bilm(4)
    export_original(other, tmp_path / "o", weights_name="other.hdf5")
    (tmp_path / "o" / "other.hdf5").rename(folder / "a_dump.hdf5")
    model = load_pretrained_bilm(make_zip(folder, tmp_path / "m.zip"))
    assert torch.equal(model.state_dict()["bilstm.bias.0"], tiny_random_bilm(3).state_dict()["bilstm.bias.0"])


def test_native_folder_zip_and_the_api_entry_points(tmp_path):
    native = tmp_path / "native"
    save_pretrained(tiny_random_bilm(5), native)
    zipped = make_zip(native, tmp_path / "native.zip", top="native")
    want = vectors(load_pretrained_bilm(native))
    for got, w in zip(list(Embedder(str(zipped)).embed_sentences(SENTENCES)), want):
        assert np.array_equal(got, w)
    elmo = Elmo.from_pretrained(zipped, dropout=0.0)
    ref = Elmo.from_pretrained(native, dropout=0.0)
    ids = batch_to_ids(SENTENCES)
    with torch.no_grad():
        assert torch.equal(elmo(ids)["elmo_representations"][0], ref(ids)["elmo_representations"][0])
    stateful = load_pretrained_bilm(zipped, stateful=True)
    assert stateful.bilm.source_archive == str(zipped)


def test_the_temporary_folder_is_removed(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    zipped = make_zip(nlpl_folder(tmp_path / "m"), tmp_path / "m.zip")
    load_pretrained_bilm(zipped)
    bad = zipfile.ZipFile(tmp_path / "bad.zip", "w")
    bad.writestr("options.json", (tmp_path / "m" / "options.json").read_text())
    bad.writestr("model.hdf5", b"not hdf5")
    bad.close()
    with pytest.raises(WeightsError):
        load_pretrained_bilm(tmp_path / "bad.zip")
    assert list(scratch.iterdir()) == []


def _one_line(exc: pytest.ExceptionInfo, *parts: str) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    for part in parts:
        assert part in msg, msg
    return msg


def test_damaged_archives_are_one_line_naming_the_file(tmp_path):
    zipped = make_zip(nlpl_folder(tmp_path / "m"), tmp_path / "m.zip")
    data = zipped.read_bytes()
    (tmp_path / "cut.zip").write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "cut.zip")
    _one_line(err, str(tmp_path / "cut.zip"), "not a readable zip archive")
    # a member whose bytes were changed: its CRC no longer matches
    with zipfile.ZipFile(tmp_path / "stored.zip", "w", compression=zipfile.ZIP_STORED) as zf:
        for path in sorted((tmp_path / "m").iterdir()):
            zf.write(path, path.name)
    raw = bytearray((tmp_path / "stored.zip").read_bytes())
    with zipfile.ZipFile(tmp_path / "stored.zip") as zf:
        info = zf.getinfo("model.hdf5")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[start + 500] ^= 0xFF
    (tmp_path / "flipped.zip").write_bytes(bytes(raw))
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "flipped.zip")
    _one_line(err, str(tmp_path / "flipped.zip"), "'model.hdf5' cannot be read")


def test_a_truncated_zip_ending_in_a_stored_zip_member_is_damaged_not_that_member(tmp_path):
    # an EFML folder zipped without compression: its .pkl members are zips themselves (torch.save). Cut after one of
    # them, zipfile finds that member's directory; the archive must be reported as damaged, not read as its content
    inner = io.BytesIO()
    torch.save({"w": torch.zeros(3)}, inner)
    with zipfile.ZipFile(tmp_path / "efml.zip", "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("zhs.model/config.json", "{}")
        zf.writestr("zhs.model/encoder.pkl", inner.getvalue())
        zf.writestr("zhs.model/word.dic", "a\t0\n" * 4000)
    with zipfile.ZipFile(tmp_path / "efml.zip") as zf:
        info = zf.getinfo("zhs.model/encoder.pkl")
    end = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size
    (tmp_path / "cut.zip").write_bytes((tmp_path / "efml.zip").read_bytes()[:end])
    with zipfile.ZipFile(tmp_path / "cut.zip") as zf:  # the premise: zipfile alone reads the .pkl's directory
        assert any(name.endswith("/data.pkl") for name in zf.namelist())
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "cut.zip")
    _one_line(err, str(tmp_path / "cut.zip"), "not a readable zip archive", "entries start at byte")


def test_a_model_nested_two_folders_deep_is_pointed_at(tmp_path):
    folder = nlpl_folder(tmp_path / "m")
    make_zip(folder, tmp_path / "deep.zip", top="models/ru_elmo")
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "deep.zip")
    _one_line(err, "holds no model at its folder models/", "model files lie in models/ru_elmo/")


@pytest.mark.parametrize("name", ["../evil.json", "/abs/options.json", "a/../../evil.json", "C:/x/options.json"])
def test_unsafe_member_names_are_refused(tmp_path, name):
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("options.json", "{}")
        zf.writestr(name, "{}")
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "evil.zip")
    _one_line(err, str(tmp_path / "evil.zip"), "unsafe name")
    assert not (tmp_path / "evil.json").exists()


def test_symlinks_and_duplicates_are_refused(tmp_path):
    link = zipfile.ZipInfo("model.hdf5")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(tmp_path / "link.zip", "w") as zf:
        zf.writestr("options.json", "{}")
        zf.writestr(link, "/etc/passwd")
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "link.zip")
    _one_line(err, "symbolic link", "'model.hdf5'")
    with zipfile.ZipFile(tmp_path / "twice.zip", "w") as zf, pytest.warns(UserWarning, match="Duplicate"):
        zf.writestr("options.json", "{}")
        zf.writestr("options.json", "{}")
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "twice.zip")
    _one_line(err, "'options.json' twice")


def test_tf_checkpoint_and_model_less_zips_say_what_they_hold(tmp_path):
    with zipfile.ZipFile(tmp_path / "ckpt.zip", "w") as zf:
        for name in ("options.json", "checkpoint", "model.ckpt-935588.index", "model.ckpt-935588.meta"):
            zf.writestr(f"elmo/{name}", "x")
        zf.writestr("elmo/model.ckpt-935588.data-00000-of-00001", "x")
        zf.writestr("elmo/vocab.txt", "<S>\n")
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "ckpt.zip")
    _one_line(err, "TensorFlow checkpoint", "model.ckpt-935588.index", "dump_weights")
    with zipfile.ZipFile(tmp_path / "text.zip", "w") as zf:
        zf.writestr("README.txt", "hello")
        zf.writestr("data/corpus.txt", "a b")
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(tmp_path / "text.zip")
    _one_line(err, "holds no model", "README.txt, data/corpus.txt")


def test_loader_errors_name_the_member_not_the_temporary_folder(tmp_path):
    folder = nlpl_folder(tmp_path / "m")
    options = json.loads((folder / "options.json").read_text())
    options["lstm"]["n_layers"] = 3
    (folder / "options.json").write_text(json.dumps(options))
    zipped = make_zip(folder, tmp_path / "m.zip", top="ru")
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(zipped)
    msg = _one_line(err, f"{zipped}:ru/model.hdf5", "missing")
    assert "elmokit-zip-" not in msg
    (tmp_path / "two").mkdir()
    for name in ("a_options.json", "b_options.json", "model.hdf5"):
        (tmp_path / "two" / name).write_bytes((folder / ("options.json" if "json" in name else name)).read_bytes())
    with pytest.raises(MissingFileError) as err:
        load_pretrained_bilm(make_zip(tmp_path / "two", tmp_path / "two.zip"))
    msg = _one_line(err, f"{tmp_path / 'two.zip'} is not a model folder", "a_options.json, b_options.json")
    assert "elmokit-zip-" not in msg


def test_cli_info_embed_convert_on_a_zip(tmp_path, capsys):
    folder = nlpl_folder(tmp_path / "m")
    zipped = make_zip(folder, tmp_path / "ru.zip", top="ru")
    assert cli_main(["info", str(zipped)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["meta"] == META and info["vocab_words"] == len(VOCAB) and info["archive"] == str(zipped)
    assert info["options"]["char_cnn"]["n_characters"] == 262
    text = tmp_path / "s.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in SENTENCES), encoding="utf-8")
    assert cli_main(["embed", str(zipped), str(text), str(tmp_path / "z.h5"), "--no-progress"]) == 0
    assert cli_main(["embed", str(folder), str(text), str(tmp_path / "f.h5"), "--no-progress"]) == 0
    with h5py.File(tmp_path / "z.h5", "r") as z, h5py.File(tmp_path / "f.h5", "r") as f:
        for i in range(len(SENTENCES)):
            assert z[str(i)].shape == (3, len(SENTENCES[i]), 16)
            assert np.array_equal(z[str(i)][...], f[str(i)][...])
    capsys.readouterr()
    assert cli_main(["embed", str(zipped), str(text), str(zipped), "--overwrite"]) == 2
    assert "is the model" in capsys.readouterr().err and zipfile.is_zipfile(zipped)
    out = tmp_path / "native"
    out.mkdir()
    (out / "vocab.txt").write_text("mine\n")
    assert cli_main(["convert", str(zipped), str(out)]) == 2  # a file convert would replace, not its own
    assert "already holds a model (vocab.txt)" in capsys.readouterr().err
    (out / "vocab.txt").unlink()
    assert cli_main(["convert", str(zipped), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "meta.json", "model.safetensors", "vocab.txt"]
    assert (out / "vocab.txt").read_text(encoding="utf-8").split() == VOCAB
    for got, want in zip(vectors(load_pretrained_bilm(out)), vectors(load_pretrained_bilm(folder))):
        assert np.array_equal(got, want)
    capsys.readouterr()
    assert cli_main(["info", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["meta"] == META


def test_cli_refusals_on_zips_are_one_line(tmp_path, capsys):
    (tmp_path / "cut.zip").write_bytes(b"PK\x03\x04 truncated")
    assert cli_main(["info", str(tmp_path / "cut.zip")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path / "cut.zip") in err
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UsageError, match="a zip of one"):
        load_pretrained_bilm(tmp_path / "notes.txt")


def test_not_enough_room_to_extract_is_one_line_and_extracts_nothing(tmp_path, monkeypatch):
    from elmokit.weights import archive

    zipped = make_zip(nlpl_folder(tmp_path / "m"), tmp_path / "m.zip")
    need = sum(info.file_size for info in zipfile.ZipFile(zipped).infolist())
    real = archive.shutil.disk_usage
    monkeypatch.setattr(archive.shutil, "disk_usage", lambda p: real(p)._replace(free=need - 1))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(WeightsError) as err:
        load_pretrained_bilm(zipped)
    _one_line(err, str(zipped), "MB to extract into", "set TMPDIR")
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_pytorch_file_given_as_the_model_is_named_as_one(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "ckpt.pt")  # torch.save writes a zip: archive/data.pkl, …
    with pytest.raises(UsageError) as err:
        load_pretrained_bilm(tmp_path / "ckpt.pt")
    _one_line(err, str(tmp_path / "ckpt.pt"), "is a PyTorch file", "not a model archive")
