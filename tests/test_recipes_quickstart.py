"""The main job end to end on its real corpus, kept short (a few steps): every stage runs and reports what it says,
its verdict on "bank" follows from the printed figures, and running it twice into one folder works."""

import json
import math
import re
from collections import Counter

import numpy as np
import pytest

from conftest import REPO_ROOT
from elmokit.cli import main as cli_main
from elmokit.errors import UsageError
from elmokit.pretraining.trainer import load_lm
from elmokit.recipes.quickstart import (
    BANK_SENTENCES,
    PERPLEXITY_MARGIN,
    SEPARATION_MARGIN,
    bank_similarities,
    load_lee_corpus,
    perplexity_verdict,
    prepare_out_dir,
    tokenize,
)
from elmokit.recipes.quickstart.protocol import _print_bank, _print_perplexity_verdict


def test_tokenize_sentences_and_punctuation():
    assert tokenize('He said "hi." Then 3,000 people left! Don\'t go.') == [
        ["He", "said", '"', "hi", ".", '"'],
        ["Then", "3,000", "people", "left", "!"],
        ["Don't", "go", "."],
    ]


def test_lee_corpus_split_is_disjoint_articles():
    train, held = load_lee_corpus()
    assert len(train) > 2000 and len(held) > 200
    assert sum(map(len, train)) > 50_000
    assert all(s for s in train + held)
    # leak-free: no held-out sentence occurs word for word in the training text (the raw split had 5 that did)
    assert not {tuple(s) for s in held} & {tuple(s) for s in train}


def test_probe_sentences_have_three_of_each_sense():
    assert [t[i] for _, t, i in BANK_SENTENCES] == ["bank"] * 6
    assert Counter(sense for sense, _, _ in BANK_SENTENCES) == {"river": 3, "money": 3}


class _FakeEmbedder:
    """Gives "bank" a chosen (L+1=2, 2P=2) vector per sentence: layer 0 the same everywhere, layer 1 as given."""

    def __init__(self, top: dict[str, np.ndarray], noise: float = 0.0):
        self.top, self.noise = top, noise

    def embed_sentence(self, tokens):
        sense = next(s for s, t, _ in BANK_SENTENCES if t == tokens)
        i = next(i for _, t, i in BANK_SENTENCES if t == tokens)
        out = np.zeros((2, len(tokens), 2), dtype=np.float32)
        out[0, i] = [1.0, 1.0]
        out[1, i] = self.top[sense] + self.noise * len(tokens)  # a little difference between sentences
        return out


def test_identical_vectors_are_not_separated_and_say_so(capsys):
    # the reported bug: 20 steps gave six cosines of 1.000 and the verdict still said "closer"
    nearly_equal = {"river": np.array([1.0, 0.0]), "money": np.array([1.0, 0.001])}
    bank = bank_similarities(_FakeEmbedder(nearly_equal, noise=1e-3))
    top = bank["layers"][-1]
    assert top["within"] == pytest.approx(1.0, abs=1e-5) and top["across"] == pytest.approx(1.0, abs=1e-5)
    assert abs(top["gap"]) < SEPARATION_MARGIN and bank["separated"] is False
    _print_bank(bank)
    printed = capsys.readouterr().out
    assert "does NOT separate" in printed and f"margin {SEPARATION_MARGIN:g}" in printed
    assert "1.0000" in printed  # four digits


def test_separated_senses_by_hand():
    # river along x, money at 60 degrees: within-sense cosines ~1, across-sense cos 60° = 0.5
    money = np.array([0.5, math.sqrt(3) / 2])
    bank = bank_similarities(_FakeEmbedder({"river": np.array([1.0, 0.0]), "money": money}))
    assert [r["layer"] for r in bank["layers"]] == [0, 1]
    layer0, top = bank["layers"]
    assert layer0["within"] == pytest.approx(1.0) and layer0["across"] == pytest.approx(1.0)
    assert layer0["gap"] == pytest.approx(0.0, abs=1e-6)
    assert top["within_river"] == pytest.approx(1.0, abs=1e-6) and top["within_money"] == pytest.approx(1.0, abs=1e-6)
    assert top["across"] == pytest.approx(0.5, abs=1e-6)
    assert top["gap"] == pytest.approx(0.5, abs=1e-6) and bank["separated"] is True
    # the verdict is the printed rule: gap >= margin
    assert (
        bank_similarities(_FakeEmbedder({"river": np.array([1.0, 0.0]), "money": money}), margin=0.6)["separated"]
        is False
    )
    cos = np.array(bank["top_layer_cosines"])
    assert cos.shape == (6, 6) and np.allclose(np.diag(cos), 1.0, atol=1e-6)


def test_perplexity_verdict_needs_the_margin(capsys):
    """Issue 19: 102.3 against Kneser-Ney's 103.2 was printed as "beats", inside the run-to-run spread."""
    level = perplexity_verdict(102.3, 103.2)
    assert level == {
        "verdict": "level with",
        "margin": PERPLEXITY_MARGIN,
        "relative_difference": pytest.approx(102.3 / 103.2 - 1, rel=1e-12),
    }
    _print_perplexity_verdict(102.3, 103.2, level)
    printed = capsys.readouterr().out
    margin = f"{100 * PERPLEXITY_MARGIN:g}"
    assert (
        f"the biLM is level with the Kneser-Ney 3-gram (102.3 vs 103.2: 0.9 % lower, within the ±{margin} % "
        "margin of run-to-run spread)"
    ) in printed
    # beyond the margin either way; exactly at the margin is still level (the rule is "more than the margin")
    assert perplexity_verdict(87.7, 103.2)["verdict"] == "beats"
    assert perplexity_verdict(103.2 * (1 + 2 * PERPLEXITY_MARGIN), 103.2)["verdict"] == "does NOT beat"
    assert perplexity_verdict(100.0 * (1 - 0.5 * PERPLEXITY_MARGIN), 100.0)["verdict"] == "level with"
    assert perplexity_verdict(80.0, 100.0, margin=0.2)["verdict"] == "level with"
    assert perplexity_verdict(79.0, 100.0, margin=0.2)["verdict"] == "beats"
    assert perplexity_verdict(99.0, 100.0, margin=0.0)["verdict"] == "beats"
    _print_perplexity_verdict(87.7, 103.2, perplexity_verdict(87.7, 103.2))
    assert "beats the Kneser-Ney 3-gram (87.7 vs 103.2: 15.0 % lower, beyond the" in capsys.readouterr().out
    for bad in (float("nan"), 0.0, -1.0, float("inf")):
        with pytest.raises(UsageError, match="positive finite"):
            perplexity_verdict(bad, 100.0)
    with pytest.raises(UsageError, match="margin"):
        perplexity_verdict(90.0, 100.0, margin=1.5)


def test_out_dir_replaces_only_an_earlier_quickstart_run(tmp_path, capsys):
    fresh = tmp_path / "new" / "qs"
    assert prepare_out_dir(fresh) is False and fresh.is_dir()
    run = tmp_path / "qs"
    (run / "train" / "model").mkdir(parents=True)
    for name in ("train.txt", "heldout.txt", "quickstart.json", "train/metrics.jsonl", ".train.txt.abc.tmp"):
        (run / name).write_text("x")
    assert prepare_out_dir(run) is True
    assert list(run.iterdir()) == []
    assert "held an earlier quickstart run; it is replaced" in capsys.readouterr().out
    # a folder holding anything else is refused, and nothing in it is touched
    other = tmp_path / "mine"
    other.mkdir()
    (other / "train.txt").write_text("keep")
    (other / "thesis.tex").write_text("keep")
    with pytest.raises(UsageError, match="thesis.tex.*choose another --out-dir"):
        prepare_out_dir(other)
    assert sorted(p.name for p in other.iterdir()) == ["thesis.tex", "train.txt"]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        prepare_out_dir(tmp_path / "afile")


def test_files_of_yours_inside_an_earlier_run_are_kept(tmp_path):
    """A new user's file in train/model/ or a sub-folder of train/ was deleted with the earlier run; now refused."""
    run = tmp_path / "qs"
    (run / "train" / "model").mkdir(parents=True)
    (run / "train" / "sub").mkdir()
    for name in (
        "train.txt",
        "train/metrics.jsonl",
        "train/ckpt-5.safetensors",
        "train/model/config.json",
        "train/model/vocab.txt",
        "train/model/mine.txt",
        "train/sub/keep.txt",
    ):
        (run / name).write_text("x")
    with pytest.raises(UsageError, match=r"train/model/mine.txt, train/sub/keep.txt"):
        prepare_out_dir(run)
    assert (run / "train" / "model" / "mine.txt").is_file() and (run / "train" / "sub" / "keep.txt").is_file()
    (run / "train" / "model" / "mine.txt").unlink()
    (run / "train" / "sub" / "keep.txt").unlink()
    (run / "train" / "sub").rmdir()
    assert prepare_out_dir(run) is True and list(run.iterdir()) == []


def test_quickstart_into_a_foreign_folder_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli_main(["quickstart", "--out-dir", str(tmp_path), "--steps", "1"]) == 2
    assert "not a quickstart run" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_quickstart_runs_every_stage_and_twice(tmp_path, capsys):
    assert cli_main(["quickstart", "--out-dir", str(tmp_path), "--steps", "20", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "quickstart.json").read_text())
    assert result["steps"] == 20
    # the held-out split is the run's held-out text: its curve is drawn beside the training curve
    assert json.loads((tmp_path / "train" / "train_config.json").read_text())["valid_files"] == [
        str(tmp_path / "heldout.txt")
    ]
    assert (tmp_path / "train" / "best" / "best.json").is_file()
    assert "add-one unigram" in printed and "(top)" in printed
    # the Kneser-Ney baseline is measured on the same split and vocabulary, and the split is written for others
    from elmokit.baselines.ngram import kneser_ney_perplexity
    from elmokit.vocabulary import Vocabulary

    kn = kneser_ney_perplexity(*load_lee_corpus(), load_lm(result["model_dir"]).vocab, order=3)
    assert result["kneser_ney_3"]["average"] == pytest.approx(kn["average"], rel=1e-12)
    assert f"average {kn['average']:.1f}" in printed
    # the verdict is the margin rule on the printed figures (issue 19), and quickstart.json keeps all of it
    versus = result["versus_kneser_ney"]
    assert versus == perplexity_verdict(result["perplexity"]["average"], kn["average"])
    assert versus["margin"] == PERPLEXITY_MARGIN and result["beats_kneser_ney"] == (versus["verdict"] == "beats")
    assert f"the biLM {versus['verdict'].replace('level', 'is level')} the Kneser-Ney 3-gram" in printed
    assert result["perplexity"]["unk_share"] == pytest.approx(
        result["perplexity"]["unk_targets"] / result["perplexity"]["tokens"]
    )
    assert Vocabulary.from_file(tmp_path / "vocab.txt").tokens == load_lm(result["model_dir"]).vocab.tokens
    assert (tmp_path / "heldout.txt").read_text().splitlines() == [" ".join(s) for s in load_lee_corpus()[1]]
    # the unigram figure is the add-one model over the saved vocabulary, recomputed here independently
    lm = load_lm(result["model_dir"])
    train, held = load_lee_corpus()
    counts = Counter(lm.vocab.token_to_id(w) for s in train for w in s)
    counts[lm.vocab.eos_id] += len(train)
    total = sum(counts.values()) + len(lm.vocab)
    targets = [lm.vocab.token_to_id(w) for s in held for w in s] + [lm.vocab.eos_id] * len(held)
    expected = math.exp(-sum(math.log((counts[t] + 1) / total) for t in targets) / len(targets))
    assert result["unigram_perplexity"] == pytest.approx(expected, rel=1e-9)
    # rare words are <UNK> (min count 2): the vocabulary is smaller than the set of training words
    assert len(lm.vocab) < len({w for s in train for w in s})
    # the verdict follows from the printed top-layer gap and the stated margin
    bank = result["bank"]
    top = bank["layers"][-1]
    assert bank["margin"] == SEPARATION_MARGIN
    assert bank["separated"] == (top["gap"] >= SEPARATION_MARGIN)
    assert f"{top['gap']:+.4f}" in printed
    assert ("are separated" in printed) == bank["separated"] and ("does NOT separate" in printed) != bank["separated"]
    assert all(-1 <= r[k] <= 1 for r in bank["layers"] for k in ("within", "across"))
    # 20 steps do not separate the senses (the bug: such a run said they were)
    assert bank["separated"] is False
    _check_readme_20_step_figures(bank)
    # the README's main-job command run twice: the second replaces the first run, and says so
    first_model = (tmp_path / "train" / "model" / "model.safetensors").read_bytes()
    assert cli_main(["quickstart", "--out-dir", str(tmp_path), "--steps", "2", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "held an earlier quickstart run; it is replaced" in printed
    assert json.loads((tmp_path / "quickstart.json").read_text())["steps"] == 2
    assert (tmp_path / "train" / "model" / "model.safetensors").read_bytes() != first_model
    records = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    # 2 steps log no training record (every 10); the held-out text is evaluated at step 0 and at the end
    assert [r["step"] for r in records if r["kind"] == "train"] == []
    assert [r["step"] for r in records if r["kind"] == "valid"] == [0, 2]
    final = json.loads((tmp_path / "quickstart.json").read_text())["perplexity"]
    # the same model and text in other batches (the held-out curve's and evaluate_perplexity's batch sizes): rows
    # the C++ LSTM kernel (native.MAX_LSTM_ROWS) or the GEMM loop computes, in float32: equal to float32 rounding
    assert records[-1]["valid_ppl"] == pytest.approx(final["average"], rel=1e-6)
    assert records[-1]["valid_ppl_fwd"] == pytest.approx(final["forward"], rel=1e-6)


def _check_readme_20_step_figures(bank: dict) -> None:
    """The quickstart tutorial's 20-step figures (docs/tutorials/quickstart.md) are what `elmokit quickstart --steps
    20` prints (issue 39 item 8): its mean cosines in layers 1 and 2 span the stated range and its top-layer gap is
    the stated one, within a few units of the 4th digit (the page says the last digits may differ with the CPU and
    thread count)."""
    text = " ".join((REPO_ROOT / "docs" / "tutorials" / "quickstart.md").read_text(encoding="utf-8").split())
    found = re.search(
        r"A 20-step run \(`elmokit quickstart --steps 20`\) printed, [^.]*?mean cosines of (0\.\d+)–(0\.\d+) in "
        r"layers 1 and 2 and a top-layer gap of \+(0\.\d+)",
        text,
    )
    assert found, "the quickstart tutorial's 20-step passage is not in the form this test reads"
    low, high, gap = map(float, found.groups())
    means = [r[k] for r in bank["layers"][1:] for k in ("within_river", "within_money", "within", "across")]
    assert min(means) == pytest.approx(low, abs=3e-4) and max(means) == pytest.approx(high, abs=3e-4)
    assert bank["layers"][-1]["gap"] == pytest.approx(gap, abs=3e-4)


def test_english_job_keeps_its_settings_and_unknown_languages_are_refused(tmp_path):
    """The shared protocol (run_job) runs the English job with the settings run_quickstart had before --lang."""
    from elmokit.recipes.quickstart import DEFAULT_MINUTES, quickstart_job, run_quickstart

    job = quickstart_job("en")
    assert job.train == dict(
        min_count=2,
        batching="sentences",
        batch_size=32,
        unroll_steps=20,
        n_epochs=1000,
        optimizer="adam",
        lr=2e-3,
        clip_norm=5.0,
        dropout=0.5,
        n_negative_samples=0,
        checkpoint_every=10_000,
        log_every=10,
        valid_every=10_000,
    )
    assert job.probes is BANK_SENTENCES and job.probe_key == "bank" and job.margin == SEPARATION_MARGIN
    assert job.perplexity_margin == PERPLEXITY_MARGIN == 0.05
    assert job.model().char_cnn.max_characters_per_token == 50 and DEFAULT_MINUTES["en"] == 5.0
    train, held, info = job.load_corpus()
    assert (train, held) == load_lee_corpus() and info == {}
    assert job.describe_corpus(train, held, info).startswith(
        f"corpus: gensim lee_background.cor — {len(train)} training sentences"
    )
    with pytest.raises(UsageError, match="--lang must be one of en, zh, got 'fr'"):
        run_quickstart(tmp_path / "qs", steps=1, lang="fr")
    assert not (tmp_path / "qs").exists()
