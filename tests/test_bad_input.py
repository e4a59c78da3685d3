"""Bad or unusual input gives defined output or a clear error, never a crash deep inside torch."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from elmokit import DataError, Elmo, Embedder, InputError, MissingFileError, UsageError, batch_to_ids, save_pretrained
from helpers import assert_close_to_scale, fixture_dir, fixture_model


@pytest.fixture(scope="module")
def elmo():
    return Elmo(bilm=fixture_model("allennlp-elmo"), num_output_representations=1, dropout=0.0)


def test_empty_batch(elmo):
    out = elmo(batch_to_ids([]))
    assert out["elmo_representations"][0].shape == (0, 0, 32)
    assert out["mask"].shape == (0, 0)


def test_empty_sentence_alone_and_in_batch(elmo):
    out = elmo(batch_to_ids([[]]))
    assert out["elmo_representations"][0].shape == (1, 0, 32)
    out = elmo(batch_to_ids([["a", "b"], []]))
    rep = out["elmo_representations"][0]
    assert out["mask"].tolist() == [[True, True], [False, False]]
    assert rep[1].abs().max() == 0
    alone = elmo(batch_to_ids([["a", "b"]]))["elmo_representations"][0]
    assert_close_to_scale(rep[0], alone[0], 1e-5)


def test_odd_tokens_give_finite_vectors(elmo):
    sentence = ["", " ", "x" * 1000, "🙂🙃", "苹果公司", "\x00\x1b[31m", "\u200b", "bank"]
    rep = elmo(batch_to_ids([sentence], empty_tokens="keep"))["elmo_representations"][0]
    assert rep.shape == (1, 8, 32) and torch.isfinite(rep).all()
    assert (rep[0, 0] - rep[0, 1]).abs().max() > 1e-4  # empty string and a space are different tokens


def test_wrong_shapes_and_types(elmo):
    with pytest.raises(InputError, match=r"\(B, T, 50\)"):
        elmo(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(InputError, match=r"\(B, T, 50\)"):
        elmo(batch_to_ids([["a"]], max_characters_per_token=20))
    with pytest.raises(InputError, match="integer ids"):
        elmo(torch.zeros(1, 2, 50))
    with pytest.raises(InputError, match="outside the character table"):
        elmo(torch.full((1, 2, 50), 999, dtype=torch.long))
    with pytest.raises(InputError, match="LongTensor"):
        elmo([["a", "b"]])


def test_flat_list_of_strings_is_an_input_error():
    with pytest.raises(InputError, match="flat list"):
        batch_to_ids(["The", "bank"])


def test_blank_token_would_move_its_neighbours_so_it_is_refused(elmo):
    # The observed problem: a tokeniser's padding token ("") was embedded and changed the vectors of "river".
    with torch.no_grad():
        clean = elmo(batch_to_ids([["the", "river", "bank"]]))["elmo_representations"][0]
        padded = elmo(batch_to_ids([["the", "river", "", "bank"]], empty_tokens="keep"))["elmo_representations"][0]
    assert (clean[0, 1] - padded[0, 1]).abs().max() > 1e-3  # "river" moved
    with pytest.raises(InputError, match=r"sentence 0, token 2 is ''"):
        batch_to_ids([["the", "river", "", "bank"]])
    embedder = Embedder(elmo.bilm)
    for bad in (["the", " ", "bank"], ["the", "\u3000"]):
        with pytest.raises(InputError, match=r"sentence 0, token 1"):
            embedder.embed_sentence(bad)
    with pytest.raises(InputError, match=r"sentence 70, token 0"):  # position in the whole stream, not the batch
        list(embedder.embed_sentences([["ok"]] * 70 + [["\t"]], batch_size=2))
    kept = Embedder(elmo.bilm, empty_tokens="keep").embed_sentence(["the", " ", "bank"])
    assert kept.shape == (3, 3, 32)


def test_embedder_model_arguments():
    # Reproductions: Embedder(options, weights) failed with "'<' not supported between 'str' and 'int'",
    # Embedder(elmo) with "'dict' object has no attribute 'layers'".
    d = fixture_dir("allennlp-elmo")
    bilm = fixture_model("allennlp-elmo")
    ref = Embedder(bilm).embed_sentence(["The", "bank"])
    from_files = Embedder(str(d / "options.json"), str(d / "lm_weights.hdf5")).embed_sentence(["The", "bank"])
    np.testing.assert_array_equal(ref, from_files)
    from_elmo = Embedder(Elmo(bilm=bilm, dropout=0.0)).embed_sentence(["The", "bank"])
    np.testing.assert_array_equal(ref, from_elmo)
    for bad, match in [(42, "got a int"), (None, "got a NoneType"), ([bilm], "got a list")]:
        with pytest.raises(UsageError, match=match):
            Embedder(bad)
    with pytest.raises(UsageError, match="weight file too"):
        Embedder(d / "options.json")
    with pytest.raises(UsageError, match="is a file"):
        Embedder(d / "lm_weights.hdf5")
    with pytest.raises(UsageError, match="keyword-only"):
        Embedder(bilm, 64)  # the old positional batch_size
    with pytest.raises(UsageError, match="keyword-only"):
        Embedder(str(d / "options.json"), 64)
    with pytest.raises(UsageError, match="batch_size"):
        Embedder(bilm, batch_size="8")
    with pytest.raises(UsageError, match="max_batch_tokens"):
        Embedder(bilm, max_batch_tokens=0)


def test_embedder_from_a_folder(tmp_path):
    bilm = fixture_model("allennlp-elmo")
    save_pretrained(bilm, tmp_path / "m")
    got = Embedder(str(tmp_path / "m")).embed_sentence(["a", "b"])
    np.testing.assert_array_equal(got, Embedder(bilm).embed_sentence(["a", "b"]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingFileError, match="not a model folder"):
        Embedder(tmp_path / "empty")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_embedder_missing_cuda_is_a_usage_error():
    # reproduction: a bare AssertionError ("Torch not compiled with CUDA enabled") came out of .to("cuda")
    with pytest.raises(UsageError, match="CUDA is not available"):
        Embedder(fixture_model("allennlp-elmo"), device="cuda")
    with pytest.raises(UsageError, match="unknown device"):
        Embedder(fixture_model("allennlp-elmo"), device="gpu0")
    assert Embedder(fixture_model("allennlp-elmo"), device="auto").device.type == "cpu"


def _datasets(path):
    with h5py.File(path, "r") as fh:
        return {k: fh[k][()] for k in fh}


def test_embed_file_decode_errors_keep_dataset_numbers(tmp_path):
    embedder = Embedder(fixture_model("allennlp-elmo"))
    src = tmp_path / "in.txt"
    src.write_bytes(b"\xef\xbb\xbfthe bank\n\xff bad line\n\nriver bank\n\x80\n")
    with pytest.raises(DataError, match=r"in.txt:2: invalid UTF-8"):
        embedder.embed_file(src, tmp_path / "strict.h5", progress=False)
    assert not (tmp_path / "strict.h5").exists()
    assert embedder.embed_file(src, tmp_path / "skip.h5", progress=False, decode_errors="skip") == 5
    assert embedder.skipped_lines == [2, 5]
    got = _datasets(tmp_path / "skip.h5")
    assert sorted(got) == ["0", "1", "2", "3", "4", "sentence_to_index"]
    assert got["0"].shape == (3, 2, 32) and got["3"].shape == (3, 2, 32)
    assert got["1"].shape == got["2"].shape == got["4"].shape == (3, 0, 32)  # skipped, blank, skipped
    assert_close_to_scale(got["3"], embedder.embed_sentence(["river", "bank"]), 1e-6)  # values reach ~1.8
    import json

    index = json.loads(got["sentence_to_index"][0])
    assert index == {"the bank": "0", "": "2", "river bank": "3"}
    assert embedder.embed_file(src, tmp_path / "rep.h5", progress=False, decode_errors="replace", layers="top") == 5
    rep = _datasets(tmp_path / "rep.h5")
    assert rep["1"].shape == (3, 32)  # "\ufffd bad line": three tokens
    with pytest.raises(UsageError, match="decode_errors"):
        embedder.embed_file(src, tmp_path / "x.h5", decode_errors="drop")
    with pytest.raises(UsageError, match="layers"):
        embedder.embed_file(src, tmp_path / "x.h5", layers="bottom")
    with pytest.raises(UsageError, match="is the input file"):
        embedder.embed_file(src, src)
    with pytest.raises(UsageError, match="is a folder"):
        embedder.embed_file(src, tmp_path)
    with pytest.raises(MissingFileError, match="no such file"):
        embedder.embed_file(tmp_path / "nope.txt", tmp_path / "x.h5")
