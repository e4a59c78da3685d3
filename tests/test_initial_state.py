"""The LSTM start state (issue 9, item 5): a window-trained model is saved with the mean carried state at sentence
starts and read from it when no state is given; everything else (old files, original-format and sentence-trained
models) keeps zeros; export refuses a model whose start state the original format cannot hold. Also `--init-from`
with a zoo model name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from elmokit import batch_to_ids
from elmokit.cli import main as cli_main
from elmokit.errors import ConfigError, InputError, MissingFileError
from elmokit.modules.bilm import StatefulBiLM
from elmokit.pretraining.perplexity import evaluate_perplexity
from elmokit.pretraining.start_state import mean_start_state, window_rows
from elmokit.pretraining.trainer import TrainConfig, Trainer, load_lm, save_lm
from elmokit.weights.native import load_native, save_pretrained
from elmokit.weights.original import export_original
from helpers import TINY_TRAIN_OPTIONS, TINY_WORDS, tiny_random_bilm

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = [["the", "river", "bank"], ["a", "bank", "loan", "is", "due"], ["water"]]


def _random_start(model, seed=1):
    cfg = model.config.lstm
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(2, cfg.n_layers, 1, cfg.dim, generator=g) - 0.5,
        torch.rand(2, cfg.n_layers, 1, cfg.projection_dim, generator=g) - 0.5,
    )


def _corpus(tmp_path, n=48):
    words = TINY_WORDS
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 5)) for i in range(n)]
    path = tmp_path / "train.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path, [line.split() for line in lines]


def _train(tmp_path, name, batching, **kw):
    train, _ = _corpus(tmp_path)
    cfg = TrainConfig(
        [str(train)],
        str(tmp_path / name),
        model=TINY_TRAIN_OPTIONS,
        batching=batching,
        batch_size=4,
        unroll_steps=5,
        max_steps=3,
        n_negative_samples=0,
        progress=False,
        seed=0,
        **kw,
    )
    return Trainer(cfg).train()


# ---------------------------------------------------------------------------------------------------- the BiLM
def test_stored_start_state_is_used_when_no_state_is_given():
    model = tiny_random_bilm()
    ids = batch_to_ids(SENTENCES)
    zero = model(ids)
    assert model.start_state is None
    assert torch.equal(zero.layers, model(ids, model.zero_state(3)).layers)  # default = zeros
    start = _random_start(model)
    model.set_start_state(start, "test")
    assert model.start_state_source == "test"
    stored = model(ids)
    explicit = model(ids, (start[0].expand(-1, -1, 3, -1), start[1].expand(-1, -1, 3, -1)))
    torch.testing.assert_close(stored.layers, explicit.layers, rtol=0, atol=0)
    assert not torch.allclose(stored.layers[:, 1:], zero.layers[:, 1:])  # the contextual layers change
    torch.testing.assert_close(stored.layers[:, 0], zero.layers[:, 0], rtol=0, atol=0)  # the token layer does not
    # an explicit state still wins, and each sentence's vectors still do not depend on its batch
    torch.testing.assert_close(model(ids, model.zero_state(3)).layers, zero.layers, rtol=0, atol=0)
    alone = model(batch_to_ids(SENTENCES[1:2])).layers[0]
    torch.testing.assert_close(alone, stored.layers[1, :, :5], rtol=1e-6, atol=1e-6)
    # the cached token-vector path starts from it too
    vectors = model.token_encoder(ids.long())
    via_vectors = model.forward_token_vectors(vectors, stored.mask)
    torch.testing.assert_close(via_vectors.layers, stored.layers, rtol=1e-6, atol=1e-6)
    # removing it gives the zero-state model back; the state_dict never holds it (formats unchanged)
    assert not any(k.startswith("start") for k in model.state_dict())
    model.set_start_state(None)
    assert model.start_state is None and torch.equal(model(ids).layers, zero.layers)


def test_stateful_wrapper_starts_and_resets_to_the_start_state():
    model = tiny_random_bilm()
    start = _random_start(model)
    model.set_start_state(start)
    ids = batch_to_ids(SENTENCES[:2])
    stateful = StatefulBiLM(model)
    first = stateful(ids)
    torch.testing.assert_close(first.layers, model(ids).layers, rtol=0, atol=0)
    second = stateful(ids)
    assert not torch.allclose(second.layers, first.layers)  # carried on
    stateful.reset_states()
    torch.testing.assert_close(stateful(ids).layers, first.layers, rtol=0, atol=0)


def test_bad_start_states_are_refused():
    model = tiny_random_bilm()
    c, h = _random_start(model)
    with pytest.raises(InputError, match=r"state must be \(c, h\).*\(2, 2, 1, 16\)"):
        model.set_start_state((c.expand(-1, -1, 2, -1), h.expand(-1, -1, 2, -1)))
    with pytest.raises(InputError, match="finite"):
        model.set_start_state((c * float("nan"), h))
    model.set_start_state((torch.zeros_like(c), torch.zeros_like(h)), "zeros")  # all zero = none stored
    assert model.start_state is None and model.start_state_source is None


# ---------------------------------------------------------------------------------------------------- files
def test_start_state_round_trips_through_the_native_file(tmp_path):
    model = tiny_random_bilm()
    start = _random_start(model)
    model.set_start_state(start, "mean carried LSTM state at 7 sentence starts of the training text")
    save_pretrained(model, tmp_path / "m")
    with safe_open(str(tmp_path / "m" / "model.safetensors"), framework="pt") as fh:
        assert fh.metadata()["start_state"] == "mean carried LSTM state at 7 sentence starts of the training text"
        assert torch.equal(fh.get_tensor("start_state.c"), start[0])
    back = load_native(tmp_path / "m")
    assert torch.equal(back.start_state[0], start[0]) and torch.equal(back.start_state[1], start[1])
    assert back.start_state_source == model.start_state_source
    ids = batch_to_ids(SENTENCES)
    torch.testing.assert_close(back(ids).layers, model(ids).layers, rtol=0, atol=0)
    assert cli_main(["info", str(tmp_path / "m")]) == 0


def test_files_without_a_start_state_start_from_zeros(tmp_path, capsys):
    model = tiny_random_bilm()
    save_pretrained(model, tmp_path / "m")  # what every file written before the start state existed holds
    with safe_open(str(tmp_path / "m" / "model.safetensors"), framework="pt") as fh:
        assert not any(k.startswith("start_state") for k in fh.keys()) and "start_state" not in fh.metadata()
    back = load_native(tmp_path / "m")
    assert back.start_state is None
    ids = batch_to_ids(SENTENCES)
    torch.testing.assert_close(back(ids).layers, back(ids, back.zero_state(3)).layers, rtol=0, atol=0)
    assert cli_main(["info", str(tmp_path / "m")]) == 0
    assert json.loads(capsys.readouterr().out)["start_state"] == "zero"


def test_export_refuses_a_model_with_a_stored_start_state(tmp_path, capsys):
    model = tiny_random_bilm()
    export_original(model, tmp_path / "plain")  # zero start state: exports as before
    model.set_start_state(_random_start(model), "mean carried LSTM state")
    with pytest.raises(ConfigError, match=r"non-zero LSTM start state \(mean carried LSTM state\).*original"):
        export_original(model, tmp_path / "refused")
    assert not (tmp_path / "refused" / "weights.hdf5").exists()
    save_pretrained(model, tmp_path / "m")
    assert cli_main(["export", str(tmp_path / "m"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "start state" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "weights.hdf5").exists()


# ---------------------------------------------------------------------------------------------------- training
def test_window_rows_from_zeros_score_like_whole_sentences(tmp_path):
    """The study's protocol: a sentence read as one window row from zeros gives the quickstart's perplexity."""
    _train(tmp_path, "s", "sentences")
    lm = load_lm(tmp_path / "s" / "model")
    nll, _ = lm.window_nll(*window_rows(SENTENCES), None)
    ref = lm.sentence_nll(SENTENCES)
    torch.testing.assert_close(nll.forward, ref.forward, rtol=1e-5, atol=1e-5)

    # backward targets come right to left in a window row: the same per-sentence sums
    def per_row(values, rows):
        return torch.zeros(len(SENTENCES)).index_add_(0, rows, values)

    torch.testing.assert_close(
        per_row(nll.backward, nll.backward_rows), per_row(ref.backward, ref.backward_rows), rtol=1e-5, atol=1e-5
    )
    assert nll.backward.numel() == ref.backward.numel() == sum(len(s) + 1 for s in SENTENCES)


def test_mean_start_state_is_the_mean_of_the_carried_states(tmp_path):
    _train(tmp_path, "s", "sentences")
    lm = load_lm(tmp_path / "s" / "model")
    sents = [["the", "cat"], ["a", "dog", "ran"], ["big", "tree"], ["red", "mat", "on"], ["sat"], ["fast"]]
    # by hand: 2 streams [s0 s1 s2] and [s3 s4 s5]; samples = the states after s0, s1 and after s3, s4
    samples = []
    for run in (sents[:3], sents[3:]):
        state = None
        for s in run[:-1]:
            _, state = lm.window_nll(*window_rows([s]), state)
            samples.append(state)
    want_c = torch.stack([s[0] for s in samples]).mean(0)
    want_h = torch.stack([s[1] for s in samples]).mean(0)
    (c, h), n = mean_start_state(lm, [[], *sents, ["dropped"]], streams=2, max_sentences=7)
    assert n == 4
    torch.testing.assert_close(c, want_c, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, want_h, rtol=1e-5, atol=1e-6)
    again, _ = mean_start_state(lm, sents, streams=2, max_sentences=7)
    assert torch.equal(again[0], c) and torch.equal(again[1], h)  # deterministic
    assert mean_start_state(lm, sents[:1], streams=2) == (None, 0)  # one sentence: nothing carried


def test_window_trained_model_is_saved_with_its_start_state(tmp_path):
    train, sents = _corpus(tmp_path)
    (tmp_path / "held.txt").write_text("the cat sat\na dog ran on the mat\n", encoding="utf-8")
    summary = _train(tmp_path, "w", "windows", valid_files=[str(tmp_path / "held.txt")], valid_every=2)
    lm = load_lm(summary["model_dir"])
    assert lm.bilm.start_state is not None
    # 48 sentences: 24 streams of 2, one sample each
    assert lm.bilm.start_state_source == "mean carried LSTM state at 24 sentence starts of the training text"
    # exactly what mean_start_state gives for the saved weights over the training text in file order
    fresh = load_lm(summary["model_dir"])
    fresh.bilm.set_start_state(None)
    (c, h), _ = mean_start_state(fresh, sents)
    assert torch.equal(lm.bilm.start_state[0], c) and torch.equal(lm.bilm.start_state[1], h)
    # perplexity (and the held-out curve) read from it; the end of the curve is the saved model's figure
    held = [["the", "cat", "sat"], ["a", "dog", "ran", "on", "the", "mat"]]
    stored, zero = evaluate_perplexity(lm, held), evaluate_perplexity(fresh, held)
    assert stored["average"] != zero["average"]
    assert summary["valid"]["valid_ppl"] == pytest.approx(stored["average"], rel=1e-6)
    # the same run again gives the same bits
    again = load_lm(_train(tmp_path, "w2", "windows")["model_dir"])
    assert torch.equal(again.bilm.start_state[0], lm.bilm.start_state[0])
    # a sentence-trained model keeps zeros, and so does a model loaded and saved again without one
    assert load_lm(_train(tmp_path, "s", "sentences")["model_dir"]).bilm.start_state is None
    save_lm(fresh, tmp_path / "resaved")
    assert load_lm(tmp_path / "resaved").bilm.start_state is None


# ---------------------------------------------------------------------------------------------------- --init-from
def test_init_from_accepts_a_zoo_name(tmp_path, monkeypatch, capsys):
    """`elmokit train --init-from elmokit-en`: before, check_model refused the name ("unknown model"), and the
    loader looked for the softmax in ./elmokit-en instead of the zoo folder."""
    from elmokit.cli.common import check_model

    monkeypatch.setenv("ELMOKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("the cat sat\n", encoding="utf-8")
    with pytest.raises(MissingFileError, match=r"zoo model 'elmokit-en' is not built.*elmokit zoo build en"):
        check_model("elmokit-en")
    assert cli_main(["train", "in.txt", "--out-dir", "x", "--init-from", "elmokit-en"]) == 2
    assert "elmokit zoo build en" in capsys.readouterr().err
    # a tiny model where the zoo keeps elmokit-en (a built folder has card.json)
    summary = _train(tmp_path, "zoo-src", "sentences")
    zoo = tmp_path / "cache" / "zoo" / "elmokit-en"
    save_lm(load_lm(summary["model_dir"]), zoo)
    (zoo / "card.json").write_text("{}", encoding="utf-8")
    check_model("elmokit-en")
    check_model("ELMOKIT-EN")
    train, _ = _corpus(tmp_path)
    assert (
        cli_main(
            [
                "train",
                str(train),
                "--out-dir",
                "cont",
                "--init-from",
                "elmokit-en",
                "--batch-size",
                "4",
                "--max-steps",
                "1",
                "--negatives",
                "0",
                "--min-count",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    capsys.readouterr()
    init = load_lm(zoo)
    cont = load_lm(tmp_path / "cont" / "model")
    assert cont.config.to_options() == init.config.to_options()
    from elmokit.pretraining.init_from import load_init_model

    loaded = load_init_model("elmokit-en")
    assert loaded.softmax is not None and loaded.vocab.tokens == init.vocab.tokens  # the zoo folder's softmax
