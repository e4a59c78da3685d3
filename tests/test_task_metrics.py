"""Task metrics (seqeval entity F1 per type, accuracy, macro F1) on hand-counted cases, and the result report
(mean ± sample std over seeds, Markdown/JSON tables, the layer-weight PNG)."""

from __future__ import annotations

import json
import math

import pytest

from elmokit.errors import InputError, UsageError
from elmokit.tasks.metrics import accuracy, entity_scores, macro_f1
from elmokit.tasks.report import (
    format_layer_weights,
    format_mean_std,
    mean_std,
    plot_layer_weights,
    results_table,
    softmax,
    write_results,
)

# gold: PER(0-1) LOC(3) | ORG(0-2) PER(4)
# pred: PER(0-1) ✓, ORG(3) ✗ (LOC in gold) | ORG(0-1) ✗ (boundary), PER(4) ✓
GOLD = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "I-ORG", "I-ORG", "O", "B-PER"]]
PRED = [["B-PER", "I-PER", "O", "B-ORG", "O"], ["B-ORG", "I-ORG", "O", "O", "B-PER"]]


def test_entity_scores_hand_case():
    s = entity_scores(GOLD, PRED)
    # 4 gold entities, 4 predicted, 2 right: P = R = F1 = 0.5
    assert (s["precision"], s["recall"], s["f1"], s["support"]) == (0.5, 0.5, 0.5, 4)
    assert s["per_type"]["PER"] == {"f1": 1.0, "precision": 1.0, "recall": 1.0, "support": 2}
    assert s["per_type"]["LOC"] == {"f1": 0.0, "precision": 0.0, "recall": 0.0, "support": 1}
    # ORG: 1 gold, 2 predicted (ORG at 3 and the short ORG), none right
    assert s["per_type"]["ORG"] == {"f1": 0.0, "precision": 0.0, "recall": 0.0, "support": 1}
    assert sorted(s["per_type"]) == ["LOC", "ORG", "PER"]


def test_entity_scores_bioes_is_strict_bio_is_conlleval():
    gold = [["B-PER", "E-PER", "O", "S-LOC"]]
    ill_formed = [["B-PER", "E-PER", "O", "I-LOC"]]  # an I- alone is not a BIOES entity
    assert entity_scores(gold, gold, "BIOES")["f1"] == 1.0
    strict = entity_scores(gold, ill_formed, "BIOES")
    assert (strict["precision"], strict["recall"]) == (1.0, 0.5)
    # in BIO (conlleval's reading) a stray I-LOC starts a LOC entity and is counted right
    assert entity_scores([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "I-LOC"]])["f1"] == 1.0
    bmes = entity_scores([["B-PER", "M-PER", "E-PER", "S-LOC"]], [["B-PER", "M-PER", "E-PER", "O"]], "BMES")
    assert (bmes["precision"], bmes["recall"]) == (1.0, 0.5)


def test_entity_scores_no_entities_and_misalignment():
    assert entity_scores([["O", "O"]], [["O", "O"]])["f1"] == 0.0
    with pytest.raises(InputError, match="sentence 1: 5 gold tags but 4 predicted"):
        entity_scores(GOLD, [PRED[0], PRED[1][:4]])
    with pytest.raises(InputError, match="gold has 2 sentences, the predictions 1"):
        entity_scores(GOLD, PRED[:1])
    with pytest.raises(UsageError, match="scheme must be one of"):
        entity_scores(GOLD, PRED, "IOBES")


def test_accuracy_and_macro_f1_hand_cases():
    assert accuracy([["A", "B"], ["C"]], [["A", "C"], ["C"]]) == pytest.approx(2 / 3)  # over tokens
    assert accuracy(["1", "0", "1", "1"], ["1", "1", "1", "0"]) == 0.5  # over sentences
    # classes a: TP1 FP1 FN0 → F1 2/3; b: TP0 FP1 FN1 → 0; c: TP1 FP0 FN1 → 2/3  → mean 4/9
    gold, pred = ["a", "b", "c", "c"], ["a", "a", "c", "b"]
    assert macro_f1(gold, pred) == pytest.approx(4 / 9)
    from sklearn.metrics import f1_score

    assert macro_f1(gold, pred) == pytest.approx(f1_score(gold, pred, average="macro"))
    assert macro_f1([["a", "b"], ["c", "c"]], [["a", "a"], ["c", "b"]]) == pytest.approx(4 / 9)
    with pytest.raises(InputError, match="gold has 2 items, the predictions 1"):
        accuracy(["a", "b"], ["a"])
    with pytest.raises(InputError, match="no gold items"):
        accuracy([], [])
    with pytest.raises(InputError, match="mix of labels"):
        accuracy(["a", ["b"]], ["a", ["b"]])


# ============================================================================================ report
def test_mean_std_is_sample_std():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    m, s = mean_std([90.0, 91.0])
    assert (m, s) == (90.5, pytest.approx(math.sqrt(0.5)))
    assert mean_std([92.14]) == (92.14, 0.0)
    assert format_mean_std(92.14, 0.26) == "92.1 ± 0.3"
    with pytest.raises(InputError):
        mean_std([])
    with pytest.raises(InputError):
        mean_std([1.0, float("nan")])


def test_results_table_markdown():
    rows = [{"row": "static", "f1": [90.0, 91.0, 92.0], "epochs": 5}, {"row": "+ELMo | mix", "f1": [93.25]}]
    table = results_table(rows, ["row", ("f1", "test F1"), "epochs"])
    assert table == (
        "| row | test F1 | epochs |\n|---|---:|---:|\n| static | 91.0 ± 1.0 | 5 |\n| +ELMo \\| mix | 93.2 | — |\n"
    )
    with pytest.raises(UsageError, match="a column is a key"):
        results_table(rows, [3])


def test_write_results_md_and_json(tmp_path):
    rows = [{"row": "static", "acc": [50.0, 52.0, 54.0]}, {"row": "elmo", "acc": [55.0, 55.0, 55.0]}]
    md, js = write_results(tmp_path / "out" / "sst5", rows, {"title": "SST-5", "epochs": 3, "columns": ["row", "acc"]})
    text = md.read_text(encoding="utf-8")
    assert text.startswith("# SST-5\n\n| row | acc |\n")
    assert "| static | 52.0 ± 2.0 |" in text and "| elmo | 55.0 ± 0.0 |" in text and "- epochs: 3" in text
    data = json.loads(js.read_text(encoding="utf-8"))
    assert data["rows"][0] == {"row": "static", "acc": {"values": [50.0, 52.0, 54.0], "mean": 52.0, "std": 2.0}}
    assert data["meta"]["epochs"] == 3
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sst5.json", "sst5.md"]  # no temp files left
    with pytest.raises(UsageError, match="cannot be written as JSON"):
        write_results(tmp_path / "bad", rows, {"x": object()})


def test_layer_weights_softmax_text_and_plot(tmp_path):
    assert softmax([0.0, 0.0]) == [0.5, 0.5]
    assert softmax([math.log(1), math.log(3)]) == pytest.approx([0.25, 0.75])
    assert format_layer_weights([0.0, math.log(3)], 1.5) == "softmax(s) = [0.250, 0.750], γ = 1.500"
    path = plot_layer_weights(
        {"NER": [0.1, 0.5, -0.2], "POS": [0.0, 0.0, 0.0]}, {"NER": 1.3}, tmp_path / "w.png", "layer weights"
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["w.png"]
    with pytest.raises(UsageError, match="same number of layers"):
        plot_layer_weights({"a": [0.0, 1.0], "b": [0.0]}, {}, tmp_path / "x.png", "t")
    with pytest.raises(UsageError, match="no rows"):
        plot_layer_weights({}, {}, tmp_path / "x.png", "t")
