"""Exports of the biLM (``elmokit.export``): the ``.pt2`` (torch.export + AOTInductor) and ONNX programs equal the
eager model, with any batch size and length, from the stored or an explicit start state; bad models and damaged
files are refused in one line.

Each format is exported **once per session** (``exported``): a tiny random model with small clips (so that both
fire), skip connections and a stored start state. The AOTInductor compile is most of this file's time."""

from __future__ import annotations

import dataclasses
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from elmokit import BiLM, CharCNNConfig, ElmoConfig, LSTMConfig, batch_to_ids
from elmokit.characters import CharVocabulary
from elmokit.cli import main as cli_main
from elmokit.errors import InputError, InputTypeError, UsageError, WeightsError
from elmokit.export import ExportedBiLM, InferenceProgram, export_model, load_exported, metadata
from elmokit.export.files import is_elmokit_export
from elmokit.modules.bilm import StatefulBiLM
from elmokit.weights.native import save_pretrained

TOL = 1e-5
CELL_CLIP, PROJ_CLIP = 0.8, 0.3
#: the AOTInductor wrapper compiled at -O0: ≈ 25 % less compile time for this file (49 → 36 s once, busy machine)
FAST_PT2 = {"aot_inductor.compile_wrapper_opt_level": "O0"}
WORDS = "the a cat dog sat ran on under mat tree big small red fast slowly quietly , . ! naïve 北京".split()


def _model(seed: int = 0, *, cell_clip=CELL_CLIP, proj_clip=PROJ_CLIP, char_vocab: CharVocabulary | None = None):
    """A tiny random biLM (filters (1,4) (2,4) (3,8), 1 highway, 2 layers of 16 cells / 8 projection, skip
    connections) whose small clips fire, with a stored start state; eval mode."""
    cc = CharCNNConfig(filters=[(1, 4), (2, 4), (3, 8)], n_highway=1, embedding_dim=4)
    if char_vocab is not None:
        cc = dataclasses.replace(
            cc, max_characters_per_token=char_vocab.max_characters_per_token, char_vocab_size=char_vocab.vocab_size
        )
    lstm = LSTMConfig(
        dim=16, projection_dim=8, n_layers=2, cell_clip=cell_clip, proj_clip=proj_clip, use_skip_connections=True
    )
    torch.manual_seed(seed)
    model = BiLM(ElmoConfig(char_cnn=cc, lstm=lstm)).eval()
    with torch.no_grad():  # non-zero biases (padding mistakes show), larger recurrent weights (the clips fire)
        for p in model.parameters():
            if p.dim() == 1 or (p.dim() == 2 and p.shape[0] == 2):
                p.uniform_(-0.5, 0.5)
        for w in list(model.bilstm.weight_hh) + list(model.bilstm.weight_proj):
            w.mul_(3.0)
    if char_vocab is not None:
        model.char_vocab = char_vocab
    gen = torch.Generator().manual_seed(seed + 1)
    model.set_start_state(
        (0.3 * torch.randn(2, 2, 1, 16, generator=gen), 0.1 * torch.randn(2, 2, 1, 8, generator=gen)), "test"
    )
    return model


@pytest.fixture(scope="session")
def model():
    return _model()


@pytest.fixture(scope="session")
def exported(model, tmp_path_factory):
    """format → the loaded export of :func:`model` (each format exported once per session)."""
    folder = tmp_path_factory.mktemp("export")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = {}
        for kind in ("onnx", "pt2"):
            path = export_model(
                model, folder / f"tiny.{kind}", kind, inductor_configs=FAST_PT2 if kind == "pt2" else None
            )
            out[kind] = load_exported(path, threads=1)
        return out
    finally:
        torch.set_num_threads(previous)


def _sentences(n: int, max_len: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(0, max_len))] for _ in range(n)]


def _assert_same(got, want) -> None:
    assert got.layers.shape == want.layers.shape
    assert torch.equal(got.mask, want.mask)
    assert got.layers.numel() == 0 or (got.layers - want.layers).abs().max().item() <= TOL
    for g, w in zip(got.state, want.state):
        assert g.shape == w.shape
        assert (g - w).abs().max().item() <= TOL


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
@pytest.mark.parametrize("batch", [1, 3, 16])
def test_equals_eager_mixed_lengths(exported, model, kind, batch):
    """Mixed lengths, an empty sentence, a token of the longest kept length (48 bytes) and a longer one (truncated),
    from the stored start state (no ``state``)."""
    sentences = _sentences(batch, 9, seed=batch)
    sentences[0] = ["x" * 48, "y" * 80, "北京" * 10, "a"]
    if batch > 1:
        sentences[1] = []
    ids = batch_to_ids(sentences)
    with torch.no_grad():
        want = model(ids)
    got = exported[kind](ids)
    _assert_same(got, want)
    assert exported[kind].meta["start_state"] is not None
    # the start state mattered: from zeros the eager vectors differ
    with torch.no_grad():
        zeros = model(ids, model.zero_state(batch))
    assert (zeros.layers - got.layers).abs().max().item() > 1e-3


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_explicit_state_and_carry(exported, model, kind):
    """A given state (c, h) as ``BiLM.forward``'s, and the state a call reaches carried into the next."""
    gen = torch.Generator().manual_seed(5)
    state = (0.5 * torch.randn(2, 2, 3, 16, generator=gen), 0.2 * torch.randn(2, 2, 3, 8, generator=gen))
    first, second = batch_to_ids(_sentences(3, 6, seed=1)), batch_to_ids(_sentences(3, 8, seed=2))
    with torch.no_grad():
        want1 = model(first, state)
        want2 = model(second, want1.state)
    got1 = exported[kind](first, state)
    got2 = exported[kind](second, got1.state)
    _assert_same(got1, want1)
    _assert_same(got2, want2)


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_clips_fire_and_match(exported, model, kind):
    """Both clips fire on this model (states reach ±clip, and a copy without clips gives other vectors), and the
    exports clip as the eager model does."""
    ids = batch_to_ids(_sentences(8, 12, seed=3))
    with torch.no_grad():
        want = model(ids)
        unclipped = _model(cell_clip=None, proj_clip=None)
        free = unclipped(ids)
    c, h = want.state
    assert torch.isclose(c.abs().amax(), torch.tensor(CELL_CLIP))
    assert torch.isclose(h.abs().amax(), torch.tensor(PROJ_CLIP))
    assert (free.layers - want.layers).abs().max().item() > 1e-2
    _assert_same(exported[kind](ids), want)


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_one_file_any_batch_and_length(exported, model, kind):
    """One exported file: lengths 1, 7, 50 and 200 with batches 1, 3 and 64 (each batch's first row the full
    length, the others mixed)."""
    for length in (1, 7, 50, 200):
        for batch in (1, 3, 64):
            sentences = _sentences(batch, length, seed=length * 100 + batch)
            sentences[0] = [WORDS[i % len(WORDS)] for i in range(length)]
            ids = batch_to_ids(sentences)
            assert ids.shape[:2] == (batch, length)
            with torch.no_grad():
                want = model(ids)
            _assert_same(exported[kind](ids), want)


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_empty_inputs(exported, model, kind):
    """Only empty sentences (T = 0, the programs take T ≥ 1: padded, then cut) and an empty batch."""
    ids = batch_to_ids([[], []])
    with torch.no_grad():
        want = model(ids)
    got = exported[kind](ids)
    assert got.layers.shape == want.layers.shape == (2, 3, 0, 16)
    _assert_same(got, want)
    empty = exported[kind](torch.zeros(0, 0, 50, dtype=torch.long))
    assert empty.layers.shape == (0, 3, 0, 16) and empty.mask.shape == (0, 0)


def test_bad_input_to_loaded_model(exported):
    ex = exported["onnx"]
    with pytest.raises(InputError, match=r"outside the character table \[0, 262\)"):
        ex(torch.full((1, 2, 50), 300))
    with pytest.raises(InputError, match=r"shape \(B, T, 50\)"):
        ex(torch.ones(1, 2, 10, dtype=torch.long))
    with pytest.raises(InputTypeError, match="integer ids"):
        ex(torch.ones(1, 2, 50))
    ids = batch_to_ids([["a", "b"]])
    ids[0, 0] = 0
    with pytest.raises(InputError, match="padding"):
        ex(ids)
    with pytest.raises(InputError, match=r"state must be \(c, h\)"):
        ex(batch_to_ids([["a"]]), (torch.zeros(2, 2, 2, 16), torch.zeros(2, 2, 2, 8)))
    c, h = ex.initial_state(1)  # a state that requires grad runs (ONNX Runtime is fed its values)
    got = ex(batch_to_ids([["a"]]), (c.clone().requires_grad_(), h.clone().requires_grad_()))
    assert torch.equal(got.layers, ex(batch_to_ids([["a"]])).layers)


def test_refuses_models_it_cannot_hold(model, tmp_path):
    with pytest.raises(InputTypeError, match="StatefulBiLM.*c0/h0") as err:
        export_model(StatefulBiLM(model), tmp_path / "m.onnx", "onnx")
    assert "\n" not in str(err.value)
    efml = _model()
    efml.config = dataclasses.replace(
        efml.config,
        char_cnn=dataclasses.replace(efml.config.char_cnn, char_vocab_size=300, word_embedding_dim=4, n_words=10),
    )
    with pytest.raises(UsageError, match="ELMoForManyLangs"):
        export_model(efml, tmp_path / "m.onnx", "onnx")
    with pytest.raises(UsageError, match="float32"):
        export_model(_model().to(torch.float64), tmp_path / "m.pt2", "pt2")
    with pytest.raises(UsageError, match=r"ending in \.pt2"):
        export_model(model, tmp_path / "m.onnx", "pt2")
    with pytest.raises(UsageError, match="format must be one of"):
        export_model(model, tmp_path / "m.pt", "torchscript")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
def test_damaged_file_names_itself(exported, kind, tmp_path):
    data = exported[kind].path.read_bytes()
    cases = {
        "truncated": data[: len(data) // 2],
        "flipped": data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1 :],
        "garbage": b"not a model at all" * 10,
    }
    for name, content in cases.items():
        path = tmp_path / f"{name}.{kind}"
        path.write_bytes(content)
        with pytest.raises(WeightsError) as err:
            load_exported(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value), name
    renamed = tmp_path / f"plain.{kind}"
    shutil.copy(exported[kind].path, renamed)  # an intact copy loads
    assert load_exported(renamed).num_layers == 3


def test_cli_exports_a_character_vocabulary_model(tmp_path, capsys):
    """``elmokit export MODEL OUT.onnx --format onnx`` on a character-vocabulary model (its own boundary rows and
    table size); the loaded file carries the vocabulary for ``batch_to_ids``. ONNX only (the program is the same
    for .pt2; a second AOTInductor compile would double this file's time)."""
    vocab = CharVocabulary(list("abcdefghijklmnopqrstuvwxyz北京"), 12)
    model = _model(seed=3, char_vocab=vocab)
    folder = tmp_path / "model"
    save_pretrained(model, folder)
    out = tmp_path / "out" / "chars.onnx"
    assert cli_main(["export", str(folder), str(tmp_path / "out" / "chars.pt2"), "--format", "onnx"]) == 2
    assert "ending in .onnx" in capsys.readouterr().err
    assert cli_main(["export", str(folder), str(out)]) == 2  # no --format: original would write a folder "chars.onnx"
    assert "pass --format onnx" in capsys.readouterr().err and not out.exists()
    assert cli_main(["export", str(folder), str(out), "--format", "onnx"]) == 0
    assert f"wrote {out} (onnx" in capsys.readouterr().out
    assert cli_main(["export", str(folder), str(out), "--format", "onnx"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert is_elmokit_export(out)  # what --overwrite may replace
    ex = load_exported(out, threads=1)
    assert ex.char_vocab.characters == vocab.characters
    ids = batch_to_ids([["abc", "北京", "zzzzzzzzzzzzzzzzz"], [], ["q"]], char_vocab=ex.char_vocab)
    with torch.no_grad():
        want = model(ids)
    _assert_same(ex(ids), want)


def _unexported(model) -> ExportedBiLM:
    """An :class:`ExportedBiLM` whose program is the eager :class:`InferenceProgram` (its input checks, no export)."""
    program = InferenceProgram(model).eval()

    def run(ids, c0, h0):
        with torch.no_grad():
            return program(ids, c0, h0)

    return ExportedBiLM(Path("eager.onnx"), "onnx", metadata(model, "onnx"), run)


def test_loaded_model_refuses_ids_of_the_other_scheme():
    """A large character vocabulary (its table holds the byte ids 259..261): byte-scheme ids are refused as
    ``BiLM`` refuses them, not run to wrong vectors; its own ids equal eager."""
    vocab = CharVocabulary([chr(0x4E00 + i) for i in range(300)] + list("abc"), 12)
    model = _model(seed=4, char_vocab=vocab)
    ex = _unexported(model)
    assert ex.n_ids > 261
    byte_ids = batch_to_ids([["abc", "de"]], 12)
    with pytest.raises(InputError, match="other character scheme"):
        model(byte_ids)
    with pytest.raises(InputError, match="other character scheme") as err:
        ex(byte_ids)
    assert "\n" not in str(err.value)
    ids = batch_to_ids([["abc", chr(0x4E00) + chr(0x4E00 + 299)], []], 12, char_vocab=ex.char_vocab)
    with torch.no_grad():
        _assert_same(ex(ids), model(ids))


def test_loaded_model_input_types(model):
    """numpy ids of a non-id dtype, uint64 and object arrays, a read-only array, a state that requires grad."""
    ex = _unexported(model)
    ids = batch_to_ids([["the", "cat"], ["a"]])
    for bad in (ids.numpy().astype(np.uint64), ids.numpy().astype(object), ids.numpy().astype(np.float32)):
        with pytest.raises(InputTypeError, match="integer ids"):
            ex(bad)
    with pytest.raises(InputTypeError, match="integer ids"):
        ex(ids.to(torch.uint64))
    frozen = ids.numpy().copy()
    frozen.setflags(write=False)
    with torch.no_grad():
        want = model(ids)
    _assert_same(ex(frozen), want)
    c, h = model.start_state
    state = (c.expand(-1, -1, 2, -1).clone().requires_grad_(), h.expand(-1, -1, 2, -1).clone().requires_grad_())
    _assert_same(ex(ids, state), want)


def test_load_exported_refuses_bad_threads(tmp_path):
    for bad in (0, -1, "2", 2.5, True, 10**6):
        with pytest.raises(UsageError, match="threads must be"):
            load_exported(tmp_path / "m.onnx", threads=bad)


def test_unwritable_output_refused_before_the_trace(model, tmp_path, monkeypatch, capsys):
    """An output under a file, or in a folder that cannot be written, is refused in one line before any trace
    (export_model and the CLI); nothing is left behind."""
    blocker = tmp_path / "file"
    blocker.write_text("x")

    def no_trace(*args, **kwargs):
        raise AssertionError("traced before checking the output")

    monkeypatch.setattr(torch.onnx, "export", no_trace)
    monkeypatch.setattr(torch.export, "export", no_trace)
    for kind in ("onnx", "pt2"):
        with pytest.raises(UsageError, match=r"cannot write the export .*file is a file, not a folder") as err:
            export_model(model, blocker / f"m.{kind}", kind)
        assert "\n" not in str(err.value)
    save_pretrained(model, tmp_path / "model")
    assert cli_main(["export", str(tmp_path / "model"), str(blocker / "m.pt2"), "--format", "pt2"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "model")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    monkeypatch.setattr(
        tempfile, "mkstemp", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
    )
    with pytest.raises(UsageError, match=r"its folder \S*ro is not writable \(Permission denied\)"):
        export_model(model, readonly / "m.onnx", "onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "ro"] and not list(readonly.iterdir())
