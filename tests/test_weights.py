"""Original HDF5 ⇄ model ⇄ native format: exact round trips, checked mismatches, the download cache."""

from __future__ import annotations

import io
import json
import shutil

import h5py
import numpy as np
import pytest
import torch

from conftest import shared_path
from elmokit import (
    PRESETS,
    BiLM,
    ConfigError,
    Elmo,
    ElmoConfig,
    MissingFileError,
    UsageError,
    WeightsError,
    batch_to_ids,
    export_original,
    load_native,
    load_original,
    load_pretrained_bilm,
    save_pretrained,
)
from elmokit.weights import native
from helpers import fixture_model

SENTS = [["The", "bank", "of", "the", "river", "."], ["Money", "in", "the", "bank"]]


def _datasets(path):
    out = {}
    with h5py.File(path, "r") as fh:
        fh.visititems(lambda n, o: out.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
    return out


@pytest.mark.parametrize("name", ["allennlp-elmo", "bilm-tf/model"])
def test_hdf5_native_hdf5_round_trip_is_bit_exact(tmp_path, name):
    d = shared_path("fixtures", *name.split("/"))
    model = load_original(d / "options.json", d / "lm_weights.hdf5")
    save_pretrained(model, tmp_path / "native")
    back = load_native(tmp_path / "native")
    options, weights = export_original(back, tmp_path / "orig")
    original, exported = _datasets(d / "lm_weights.hdf5"), _datasets(weights)
    assert sorted(original) == sorted(exported)
    for key in original:
        assert original[key].dtype == exported[key].dtype == np.float32
        assert original[key].shape == exported[key].shape, key
        assert np.array_equal(original[key].view(np.uint32), exported[key].view(np.uint32)), key
    assert json.loads(options.read_text())["lstm"] == json.loads((d / "options.json").read_text())["lstm"]
    with torch.no_grad():
        a = model(batch_to_ids(SENTS)).layers
        b = load_original(options, weights)(batch_to_ids(SENTS)).layers
    assert torch.equal(a, b)


def _copy_fixture(tmp_path):
    d = shared_path("fixtures", "allennlp-elmo")
    shutil.copy(d / "options.json", tmp_path / "options.json")
    shutil.copy(d / "lm_weights.hdf5", tmp_path / "w.hdf5")
    return tmp_path / "options.json", tmp_path / "w.hdf5"


def _edit_options(path, fn):
    o = json.loads(path.read_text())
    fn(o)
    path.write_text(json.dumps(o))


def test_wrong_shape_names_dataset_and_both_shapes(tmp_path):
    options, weights = _copy_fixture(tmp_path)
    _edit_options(options, lambda o: o["lstm"].__setitem__("dim", 32))
    with pytest.raises(WeightsError) as err:
        load_original(options, weights)
    msg = str(err.value)
    assert "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0" in msg and "(32, 256)" in msg and "(32, 128)" in msg


def test_wrong_filters_and_layers(tmp_path):
    options, weights = _copy_fixture(tmp_path)
    _edit_options(options, lambda o: o["char_cnn"]["filters"].append([6, 8]))
    with pytest.raises(WeightsError, match=r"CNN/W_cnn_5"):
        load_original(options, weights)
    _edit_options(options, lambda o: (o["char_cnn"]["filters"].pop(), o["lstm"].__setitem__("n_layers", 1)))
    with pytest.raises(WeightsError, match=r"Cell1.*not expected"):
        load_original(options, weights)
    _edit_options(options, lambda o: (o["lstm"].__setitem__("n_layers", 2), o["char_cnn"].__setitem__("n_highway", 1)))
    with pytest.raises(WeightsError, match=r"CNN_high_1"):
        load_original(options, weights)


def test_missing_and_extra_datasets(tmp_path):
    options, weights = _copy_fixture(tmp_path)
    with h5py.File(weights, "a") as fh:
        del fh["CNN_proj/b_proj"]
    with pytest.raises(WeightsError, match=r"CNN_proj/b_proj.*missing"):
        load_original(options, weights)
    options, weights = _copy_fixture(tmp_path)
    with h5py.File(weights, "a") as fh:
        fh["CNN/W_cnn_9"] = np.zeros(3, dtype=np.float32)
    with pytest.raises(WeightsError, match=r"CNN/W_cnn_9"):
        load_original(options, weights)


def test_not_hdf5_and_missing_file(tmp_path):
    options, weights = _copy_fixture(tmp_path)
    data = weights.read_bytes()
    weights.write_bytes(b"not an hdf5 file")
    with pytest.raises(WeightsError, match=r"w.hdf5 is not a readable HDF5"):
        load_original(options, weights)
    weights.write_bytes(data[: len(data) // 2])  # truncated download
    with pytest.raises(WeightsError, match=r"w.hdf5 is not a readable HDF5"):
        load_original(options, weights)
    with pytest.raises(WeightsError, match=r"options.json is a JSON file, not an HDF5"):
        load_original(options, options)  # the two swapped: options.json as the weights ...
    with pytest.raises(ConfigError, match=r"w.hdf5 is an HDF5 file, not a JSON options file"):
        load_original(weights, options)  # ... or the HDF5 as the options
    with pytest.raises(MissingFileError, match="nope.hdf5"):
        load_original(options, tmp_path / "nope.hdf5")
    with pytest.raises(MissingFileError, match="is a folder"):
        load_original(options, tmp_path)
    with pytest.raises(MissingFileError, match="options file not found"):
        load_original(tmp_path / "nope.json", weights)


def _options_with(tmp_path, fn, name="opts.json"):
    o = json.loads((shared_path("fixtures", "allennlp-elmo") / "options.json").read_text())
    fn(o)
    path = tmp_path / name
    path.write_text(json.dumps(o))
    return path


def _set(section, key, value):
    def fn(o):
        target = o[section] if section else o
        if isinstance(key, tuple):
            target = target[key[0]]
            target[key[1]] = value
        else:
            target[key] = value

    return fn


@pytest.mark.parametrize(
    "section,key,value,match",
    [
        # reproduction: "false" (a string) was read as true
        ("lstm", "use_skip_connections", "false", r'lstm.use_skip_connections="false"; expected a JSON boolean'),
        ("lstm", "use_skip_connections", 0, r"lstm.use_skip_connections=0; expected a JSON boolean"),
        # reproduction: malformed filters gave "not enough values to unpack"
        (
            "char_cnn",
            "filters",
            [[1, 4], [2]],
            r"char_cnn.filters entry 1 is \[2\]; expected \[width, n_filters\].*\[\[width, n_filters\], \.\.\.\]",
        ),
        ("char_cnn", "filters", [1, 4], r"char_cnn.filters entry 0 is 1; expected \[width, n_filters\]"),
        ("char_cnn", "filters", "[[1, 4]]", r"char_cnn.filters=.*expected a non-empty list \[\[width, n_filters\]"),
        ("char_cnn", "filters", [], r"char_cnn.filters=\[\]"),
        ("char_cnn", "filters", [[1, 4.5]], r"char_cnn.filters entry 0 is \[1, 4.5\]"),
        ("char_cnn", "filters", [[0, 4]], r"char_cnn.filters entry 0 is \[0, 4\]"),
        ("lstm", "dim", "64", r'lstm.dim="64"; expected a JSON integer >= 1'),
        ("lstm", "n_layers", 2.5, r"lstm.n_layers=2.5; expected a JSON integer"),
        ("lstm", "n_layers", True, r"lstm.n_layers=true; expected a JSON integer"),
        ("lstm", "projection_dim", 0, r"lstm.projection_dim=0; expected an integer >= 1"),
        ("lstm", "cell_clip", "3", r'lstm.cell_clip="3"; expected null \(no clipping\) or a finite number >= 0'),
        ("lstm", "proj_clip", -1, r"lstm.proj_clip=-1; expected null"),
        ("char_cnn", "n_highway", -1, r"char_cnn.n_highway=-1; expected an integer >= 0"),
        ("char_cnn", ("embedding", "dim"), "4", r'char_cnn.embedding.dim="4"'),
        ("char_cnn", "embedding", 4, r"char_cnn.embedding is 4; expected an object"),
        ("char_cnn", "activation", "gelu", r"char_cnn.activation='gelu'"),
        (
            "char_cnn",
            "max_characters_per_token",
            4,
            r"max_characters_per_token=4 is smaller than the widest filter \(5\)",
        ),
        ("char_cnn", "n_characters", 300, r"char_cnn.n_characters=300"),
        (None, "lstm", [], r"'lstm' is \[\]; expected a JSON object"),
    ],
)
def test_invalid_options_name_file_key_and_value(tmp_path, section, key, value, match):
    path = _options_with(tmp_path, _set(section, key, value))
    with pytest.raises(ConfigError, match=match) as err:
        ElmoConfig.from_json_file(path)
    assert str(path) in str(err.value)


def test_options_boolean_skip_connections_read_exactly(tmp_path):
    assert (
        ElmoConfig.from_json_file(
            _options_with(tmp_path, _set("lstm", "use_skip_connections", False))
        ).lstm.use_skip_connections
        is False
    )
    config = ElmoConfig.from_json_file(_options_with(tmp_path, _set("lstm", "use_skip_connections", True)))
    assert config.lstm.use_skip_connections is True
    assert config.char_cnn.filters == [(1, 4), (2, 8), (3, 16), (4, 32), (5, 64)]
    assert config.lstm.cell_clip == 3.0 and isinstance(config.lstm.cell_clip, float)
    with pytest.raises(ConfigError, match=r"missing required key lstm.dim"):
        ElmoConfig.from_json_file(_options_with(tmp_path, lambda o: o["lstm"].pop("dim")))


def test_options_file_not_utf8_json(tmp_path):
    (tmp_path / "o.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigError, match=r"o.json is not a UTF-8 JSON options file"):
        ElmoConfig.from_json_file(tmp_path / "o.json")
    (tmp_path / "o.json").write_text("{lstm: 1}")
    with pytest.raises(ConfigError, match=r"o.json is not valid JSON"):
        ElmoConfig.from_json_file(tmp_path / "o.json")
    (tmp_path / "o.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"o.json: options must be a JSON object"):
        ElmoConfig.from_json_file(tmp_path / "o.json")
    with pytest.raises(MissingFileError, match="is a folder"):
        ElmoConfig.from_json_file(tmp_path)


def test_load_pretrained_bilm_paths(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "sub").mkdir()
    with pytest.raises(MissingFileError) as err:
        load_pretrained_bilm(tmp_path)
    msg = str(err.value)
    assert str(tmp_path) in msg and "config.json + model.safetensors" in msg and "*options*.json" in msg
    assert "notes.txt, sub/" in msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match="nothing"):
        load_pretrained_bilm(tmp_path / "empty")
    d = shared_path("fixtures", "allennlp-elmo")
    with pytest.raises(UsageError, match="is a file.*its options.json too"):
        load_pretrained_bilm(d / "lm_weights.hdf5")
    with pytest.raises(UsageError, match="is a file.*its HDF5 weight file too"):
        load_pretrained_bilm(d / "options.json")
    with pytest.raises(UsageError, match="is a file"):
        load_pretrained_bilm(tmp_path / "notes.txt")
    with pytest.raises(MissingFileError, match="no such folder"):
        load_pretrained_bilm(tmp_path / "missing")
    with pytest.raises(UsageError, match="unknown model 'smal'.*original, original-5.5b, small"):
        load_pretrained_bilm("smal")
    with pytest.raises(UsageError, match="released model name"):
        load_pretrained_bilm(42)
    save_pretrained(fixture_model("allennlp-elmo"), tmp_path / "native")
    (tmp_path / "native" / "model.safetensors").unlink()
    with pytest.raises(MissingFileError, match="model.safetensors not found"):
        load_pretrained_bilm(tmp_path / "native")
    with pytest.raises(UsageError, match="is a file"):
        load_pretrained_bilm(tmp_path / "native" / "config.json")


def test_n_characters_261_and_262_both_accepted(tmp_path):
    options, weights = _copy_fixture(tmp_path)
    reference = load_original(options, weights)
    _edit_options(options, lambda o: o["char_cnn"].__setitem__("n_characters", 261))
    m261 = load_original(options, weights)
    with torch.no_grad():
        assert torch.equal(reference(batch_to_ids(SENTS)).layers, m261(batch_to_ids(SENTS)).layers)
    _edit_options(options, lambda o: o["char_cnn"].__setitem__("n_characters", 300))
    with pytest.raises(ValueError, match="n_characters"):
        load_original(options, weights)


def test_native_mismatch_named(tmp_path):
    model = fixture_model("allennlp-elmo")
    save_pretrained(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["lstm"]["projection_dim"] = 8
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=r"has shape .* implies"):
        load_native(tmp_path)


def test_preset_parameter_counts():
    expected = {"small": 13_593_296, "medium": 28_027_728, "original": 93_600_848, "original-5.5b": 93_600_848}
    for name, count in expected.items():
        model = BiLM(PRESETS[name]())
        assert sum(p.numel() for p in model.parameters()) == count, name
        assert model.token_encoder.char_cnn.char_embedding.shape[0] == 261


class _FakeResponse(io.BytesIO):
    def __init__(self, data: bytes, declared: int | None = None):
        super().__init__(data)
        self.headers = {"Content-Length": str(declared if declared is not None else len(data))}


def test_from_pretrained_downloads_once_then_offline(tmp_path, monkeypatch):
    d = shared_path("fixtures", "allennlp-elmo")
    files = {"options": (d / "options.json").read_bytes(), "weights": (d / "lm_weights.hdf5").read_bytes()}
    calls = []

    def fake_open(url):
        calls.append(url)
        return _FakeResponse(files["options" if url.endswith(".json") else "weights"])

    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_urlopen", fake_open)
    elmo = Elmo.from_pretrained("small", dropout=0.0)
    assert len(calls) == 2 and calls[0] == native.RELEASED["small"][0]
    assert (tmp_path / "cache" / "small" / "weights.hdf5").read_bytes() == files["weights"]

    def offline(url):
        raise OSError("network unreachable")

    monkeypatch.setattr(native, "_urlopen", offline)
    again = Elmo.from_pretrained("small", dropout=0.0)  # served from the cache
    with torch.no_grad():
        a = elmo(batch_to_ids(SENTS))["elmo_representations"][0]
        b = again(batch_to_ids(SENTS))["elmo_representations"][0]
    assert torch.equal(a, b)


def test_interrupted_download_leaves_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_urlopen", lambda url: _FakeResponse(b"x" * 10, declared=1000))
    with pytest.raises(OSError, match="stopped at 10 of 1000"):
        Elmo.from_pretrained("original")
    leftovers = list((tmp_path / "cache").rglob("*"))
    assert [p for p in leftovers if p.is_file()] == []
    with pytest.raises(ValueError, match="unknown model"):
        Elmo.from_pretrained("no-such-model")


def test_from_pretrained_local_dirs(tmp_path):
    model = fixture_model("allennlp-elmo")
    save_pretrained(model, tmp_path / "native")
    export_original(model, tmp_path / "orig")
    ids = batch_to_ids(SENTS)
    with torch.no_grad():
        ref = model(ids).layers
        for sub in ("native", "orig"):
            got = Elmo.from_pretrained(tmp_path / sub, dropout=0.0).bilm(ids).layers
            assert torch.equal(ref, got), sub
