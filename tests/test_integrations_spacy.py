"""The spaCy component (``elmokit.integrations.spacy``, the ``spacy`` extra, in ``test``): ``doc._.elmo`` and the
vectors equal the Embedder's for the same layer choice, ``nlp.pipe`` of 200 real sentences (UD English-EWT dev)
equals one doc at a time, a saved pipeline loads in a fresh process that finds the factory through the
``spacy_factories`` entry point and has never seen the model's folder, the Chinese tokeniser (jieba) feeds it words,
and it runs after a trained pipeline's own components without touching ``doc.tensor``. The model is the AllenNLP
test fixture (../shared/fixtures/allennlp-elmo) in the native format."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT, shared_path
from elmokit import Embedder
from elmokit.errors import MissingExtraError, MissingFileError, UsageError
from elmokit.weights.native import save_pretrained
from helpers import assert_close_to_scale, docs_example, fixture_model

spacy = pytest.importorskip("spacy", reason="pip install 'elmokit[spacy]'")
import elmokit.integrations.spacy as component_module  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

TEXT = "The bank closed early. Then it rained."
#: the stated batch bound of Embedder.embed_sentences (relative to each layer's largest |value|, absolute below 1)
BATCH_BOUND = 1e-5


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("native") / "model"
    save_pretrained(fixture_model("allennlp-elmo"), folder)
    return folder


@pytest.fixture(scope="module")
def embedder(native) -> Embedder:
    return Embedder(native, empty_tokens="keep")


def _nlp(native, lang: str = "en", **config):
    nlp = spacy.blank(lang)
    nlp.add_pipe("elmokit", config={"model": str(native), **config})
    return nlp


def _ewt_texts(n: int) -> list[str]:
    texts = []
    with open(shared_path("data", "ud-english-ewt", "en_ewt-ud-dev.conllu"), encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("# text = "):
                texts.append(line[len("# text = ") :].strip())
                if len(texts) == n:
                    break
    return texts


def test_the_doc_gets_every_layer_and_the_tokens_their_columns(native, embedder):
    doc = _nlp(native)(TEXT)
    words = [t.text for t in doc]
    want = embedder.embed_sentence(words)
    assert doc._.elmo.shape == (3, len(doc), 32) and doc._.elmo.dtype == np.float32
    np.testing.assert_array_equal(doc._.elmo, want)
    np.testing.assert_array_equal(doc[1]._.elmo, want[:, 1])
    np.testing.assert_array_equal(doc[1:3]._.elmo, want[:, 1:3])
    assert doc.tensor.size == 0  # left to spaCy's own components


@pytest.mark.parametrize("layers", ["average", "top", 0, 1, "all"])
def test_token_vectors_equal_the_embedders_for_the_same_layers(native, embedder, layers):
    doc = _nlp(native, layers=layers)(TEXT)
    want = embedder.embed_sentence([t.text for t in doc], layers=layers)
    if layers == "all":  # (L+1, n, D) → (n, (L+1)·D), layer 0 first, as flair's "all"
        want = np.concatenate(list(want), axis=-1)
    got = np.stack([t.vector for t in doc])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(doc[2:5].vector, got[2:5].mean(axis=0))
    np.testing.assert_array_equal(doc.vector, got.mean(axis=0))
    assert doc[1].has_vector and doc.has_vector


def test_similarity_is_the_cosine_of_the_vectors(native):
    doc = _nlp(native)(TEXT)
    a, b = doc[1].vector.astype(np.float64), doc[7].vector.astype(np.float64)
    cosine = a @ b / np.sqrt((a @ a) * (b @ b))
    assert doc[1].similarity(doc[7]) == pytest.approx(cosine, rel=1e-12)
    assert doc[0:3].similarity(doc[0:3]) == pytest.approx(1.0)
    assert doc.similarity(doc[0:3]) == pytest.approx(
        float(doc.vector @ doc[0:3].vector / (doc.vector_norm * doc[0:3].vector_norm)), rel=1e-6
    )
    assert doc[1].vector_norm == pytest.approx(float(np.sqrt(a @ a)), rel=1e-12)


def test_pipe_of_200_real_sentences_equals_one_at_a_time(native):
    texts = _ewt_texts(200)
    nlp = _nlp(native, layers="top")
    alone = [nlp(t) for t in texts]
    batched = list(nlp.pipe(texts, batch_size=64))
    assert [d.text for d in batched] == texts
    for one, many in zip(alone, batched):
        assert_close_to_scale(many._.elmo, one._.elmo, BATCH_BOUND, dim=1)
        assert_close_to_scale(np.stack([t.vector for t in many]), np.stack([t.vector for t in one]), BATCH_BOUND)
    # one doc per batch: bitwise
    for one, single in zip(alone[:20], nlp.pipe(texts[:20], batch_size=1)):
        np.testing.assert_array_equal(single._.elmo, one._.elmo)


def test_chinese_blank_pipeline_with_jieba_gives_word_tokens(native, embedder):
    nlp = spacy.blank("zh", config={"nlp": {"tokenizer": {"segmenter": "jieba"}}})
    nlp.add_pipe("elmokit", config={"model": str(native)})
    doc = nlp("我喜欢吃苹果")
    assert [t.text for t in doc] == ["我", "喜欢", "吃", "苹果"]
    assert doc._.elmo.shape == (3, 4, 32)
    np.testing.assert_array_equal(
        doc[3].vector, embedder.embed_sentence(["我", "喜欢", "吃", "苹果"], layers="average")[3]
    )


def test_it_runs_after_a_trained_pipelines_components_and_leaves_doc_tensor(native):
    """A small trained pipeline (tok2vec + tagger, a few updates on EWT sentences) stands in for an installed one:
    the tagger's tags and the tok2vec's doc.tensor are what they were without the elmokit component."""
    from spacy.training import Example

    nlp = spacy.blank("en")
    nlp.add_pipe("tok2vec")
    nlp.add_pipe("tagger")
    docs = [nlp.make_doc(text) for text in _ewt_texts(8)]
    examples = [Example.from_dict(d, {"tags": ["X" if t.is_alpha else "Y" for t in d]}) for d in docs]
    nlp.initialize(lambda: examples)
    for _ in range(2):
        nlp.update(examples)
    before = nlp(TEXT)
    nlp.add_pipe("elmokit", config={"model": str(native)})
    after = nlp(TEXT)
    assert nlp.pipe_names == ["tok2vec", "tagger", "elmokit"]
    assert [t.tag_ for t in after] == [t.tag_ for t in before]
    assert after.tensor.shape[0] == len(after) and after.tensor.size > 0
    np.testing.assert_array_equal(after.tensor, before.tensor)
    assert after._.elmo.shape == (3, len(after), 32)


def test_a_saved_pipeline_loads_in_a_fresh_process_without_the_model_folder(native, tmp_path):
    """Saved with a model folder that is then deleted; the fresh process finds the factory through the
    spacy_factories entry point (a dist-info on its path declaring the pyproject's entry point, as an installed
    elmokit does) without importing elmokit itself."""
    model = tmp_path / "gone"
    shutil.copytree(native, model)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmokit", config={"model": str(model), "layers": 1})
    texts = _ewt_texts(12)
    want = np.stack([d.vector for d in nlp.pipe(texts)])
    nlp.to_disk(tmp_path / "pipeline")
    assert sorted(os.listdir(tmp_path / "pipeline" / "elmokit" / "model")) == ["config.json", "model.safetensors"]
    shutil.rmtree(model)

    entry = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["spacy_factories"]
    dist = tmp_path / "site" / "elmokit_entry_points-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: elmokit-entry-points\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[spacy_factories]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items()))
    code = (
        "import json, sys, spacy, numpy as np; "
        f"nlp = spacy.load({str(tmp_path / 'pipeline')!r}); "
        f"texts = json.loads({json.dumps(json.dumps(texts))}); "
        "v = np.stack([d.vector for d in nlp.pipe(texts)]); "
        f"np.save({str(tmp_path / 'loaded.npy')!r}, v); "
        "print(json.dumps({'pipes': nlp.pipe_names, 'elmokit_imported_first': False}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), str(dist.parent)])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["pipes"] == ["elmokit"]
    np.testing.assert_array_equal(np.load(tmp_path / "loaded.npy"), want)


def test_the_entry_point_names_the_factory():
    entry = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["spacy_factories"]
    assert entry == {"elmokit": "elmokit.integrations.spacy:make_elmokit"}
    assert component_module.make_elmokit.__name__ == "make_elmokit"


def test_bad_settings_and_models_fail_at_add_pipe(native, tmp_path):
    with pytest.raises(UsageError, match="layers"):
        _nlp(native, layers="middle")
    with pytest.raises(UsageError, match="not a layer of this model"):
        _nlp(native, layers=7)
    with pytest.raises(UsageError, match="batch_size"):
        _nlp(native, batch_size=0)
    with pytest.raises(MissingFileError):
        _nlp(tmp_path / "no-such-model")


def test_without_spacy_the_import_names_the_extra(monkeypatch):
    for key in [k for k in sys.modules if k == "spacy" or k.startswith("spacy.")]:
        monkeypatch.setitem(sys.modules, key, None)
    monkeypatch.delitem(sys.modules, "elmokit.integrations.spacy")
    with pytest.raises(MissingExtraError) as info:
        import elmokit.integrations.spacy  # noqa: F401
    assert str(info.value).endswith("pip install 'elmokit[spacy]'") and "\n" not in str(info.value)


def test_the_documented_example(native, tmp_path, capsys):
    code = docs_example("how-to/integrations.md", "## spaCy")
    code = code.replace('"elmokit-en"', repr(str(native))).replace('"elmo_pipeline"', repr(str(tmp_path / "p")))
    namespace: dict = {}
    exec(compile(code, "docs/how-to/integrations.md (spaCy)", "exec"), namespace)
    assert namespace["doc"]._.elmo.shape == (3, 5, 32)
    assert capsys.readouterr().out.splitlines()[:2] == ["(3, 5, 32)", "(3, 32) (32,)"]
    assert len(namespace["docs"]) == 2
    loaded = spacy.load(tmp_path / "p")
    np.testing.assert_array_equal(loaded("The bank closed early.")._.elmo, namespace["doc"]._.elmo)


def test_threads_applies_while_embedding_and_is_restored(native, embedder):
    import torch

    before = torch.get_num_threads()
    doc = _nlp(native, threads=1)(TEXT)
    assert torch.get_num_threads() == before
    # another thread count sums in another order: equal to rounding (bitwise for a given count)
    assert_close_to_scale(doc._.elmo, embedder.embed_sentence([t.text for t in doc]), BATCH_BOUND, dim=1)


def test_after_an_installed_pretrained_pipeline(native):
    """With en_core_web_sm installed (not in the test extra: spaCy's pipelines are not on PyPI), the component runs
    after its components and leaves what they set."""
    if not spacy.util.is_package("en_core_web_sm"):
        pytest.skip("en_core_web_sm is not installed (python -m spacy download en_core_web_sm)")
    nlp = spacy.load("en_core_web_sm")
    before = nlp(TEXT)
    nlp.add_pipe("elmokit", config={"model": str(native)})
    after = nlp(TEXT)
    assert [(t.tag_, t.dep_, t.ent_type_) for t in after] == [(t.tag_, t.dep_, t.ent_type_) for t in before]
    np.testing.assert_array_equal(after.tensor, before.tensor)
    assert after._.elmo.shape == (3, len(after), 32)
