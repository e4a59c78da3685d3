"""Hugging Face Hub names and ``push_to_hub`` (the ``hub`` extra, in ``test``), offline: a Hub cache laid out as
huggingface_hub documents it (``models--org--name/refs/<ref>`` holding a commit, ``snapshots/<commit>/<files>``)
is resolved with ``HF_HUB_OFFLINE=1``; the upload is checked up to the call that would send (``HfApi`` replaced).
The model is the AllenNLP test fixture (../shared/fixtures/allennlp-elmo) in the native format."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO_ROOT
from elmokit import Elmo, Embedder
from elmokit.cli import main as cli_main
from elmokit.errors import MissingFileError, UsageError
from elmokit.weights import hub as hub_names
from elmokit.weights.hub import parse_hub_name
from elmokit.weights.native import save_pretrained
from helpers import docs_example, fixture_model

huggingface_hub = pytest.importorskip("huggingface_hub", reason="pip install 'elmokit[hub]'")
import huggingface_hub.constants as hf_constants  # noqa: E402

from elmokit.integrations.hub import hub_card, push_plan, push_to_hub  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLDER = "fedcba9876543210fedcba9876543210fedcba98"
SENTENCE = ["The", "bank", "closed", "early", "."]


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Path:
    """The fixture model as a native folder (what `elmokit convert options.json lm_weights.hdf5 OUT` writes)."""
    folder = tmp_path_factory.mktemp("native") / "model"
    save_pretrained(fixture_model("allennlp-elmo"), folder)
    return folder


def _lay_out_cache(cache: Path, repo_id: str, files: Path, commit: str = COMMIT, refs=("main",)) -> Path:
    """A Hub cache entry as huggingface_hub writes it (blobs are symlinked there; copies read the same)."""
    entry = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = entry / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in files.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (entry / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (entry / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty Hub cache, offline, for this process (huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE into its
    constants when imported: a user sets them before the process starts, as the subprocess test does)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_names, "_RESOLVED", {})
    return cache


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("org/name", ("org/name", None)),
        ("my-org/elmo.en_v2@main", ("my-org/elmo.en_v2", "main")),
        (f"org/name@{COMMIT}", ("org/name", COMMIT)),
        ("small", None),
        ("a/b/c", None),
        ("/abs/path", None),
        ("./org/name", None),
        ("org/na--me", None),
        ("org/name@", None),
        ("org/na me", None),
    ],
)
def test_hub_names_are_parsed(name, parsed):
    assert parse_hub_name(name) == parsed


def test_an_offline_cache_gives_the_same_vectors_as_the_folder(native, offline_cache):
    snapshot = _lay_out_cache(offline_cache, "org/elmo-tiny", native)
    want = Embedder(native).embed_sentence(SENTENCE)
    got = Embedder("org/elmo-tiny").embed_sentence(SENTENCE)
    assert got.shape == (3, 5, 32)
    np.testing.assert_array_equal(got, want)
    assert hub_names.hub_model_dir("org/elmo-tiny") == snapshot
    elmo = Elmo.from_pretrained("org/elmo-tiny", num_output_representations=1)
    assert elmo.bilm.output_dim == 32


def test_a_revision_picks_its_snapshot(native, offline_cache, tmp_path):
    other = tmp_path / "other"
    save_pretrained(fixture_model("allennlp-elmo"), other)
    _lay_out_cache(offline_cache, "org/m", native, COMMIT, refs=("main",))
    older = _lay_out_cache(offline_cache, "org/m", other, OLDER, refs=("v1",))
    assert hub_names.hub_model_dir("org/m@v1") == older
    assert hub_names.hub_model_dir(f"org/m@{OLDER}") == older
    assert hub_names.hub_model_dir("org/m").name == COMMIT


def test_a_local_folder_of_that_name_wins(native, offline_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "org" / "name"
    save_pretrained(fixture_model("allennlp-elmo"), local)
    # no Hub entry at all: the local folder is used, the Hub is not asked
    vectors = Embedder("org/name").embed_sentence(SENTENCE)
    np.testing.assert_array_equal(vectors, Embedder(native).embed_sentence(SENTENCE))
    assert hub_names._RESOLVED == {}


def test_an_unreachable_name_is_one_line(offline_cache):
    with pytest.raises(MissingFileError) as info:
        Embedder("org/not-cached@v2")
    text = str(info.value)
    assert "\n" not in text
    assert "org/not-cached at revision v2" in text and "HF_HUB_OFFLINE" in text
    assert str(offline_cache) in text


def test_the_cli_takes_a_hub_name_and_says_one_line_when_it_is_missing(native, offline_cache, capsys):
    _lay_out_cache(offline_cache, "org/elmo-tiny", native)
    assert cli_main(["info", "org/elmo-tiny"]) == 0
    assert json.loads(capsys.readouterr().out)["output_dim"] == 32
    assert cli_main(["info", "org/absent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("elmokit info: error: model 'org/absent'")


def test_without_huggingface_hub_the_message_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as when it is not installed
    monkeypatch.setattr(hub_names, "_RESOLVED", {})
    with pytest.raises(MissingFileError, match=r"pip install 'elmokit\[hub\]'"):
        Embedder("org/name")


def test_hf_home_and_offline_from_the_environment_in_a_fresh_process(native, tmp_path):
    """As a user runs it: HF_HOME set (the cache is $HF_HOME/hub) and HF_HUB_OFFLINE=1, before Python starts."""
    home = tmp_path / "hf-home"
    _lay_out_cache(home / "hub", "org/elmo-tiny", native)
    code = (
        "import json, numpy as np; from elmokit import Embedder; "
        f"a = Embedder('org/elmo-tiny').embed_sentence({SENTENCE!r}); "
        f"b = Embedder({str(native)!r}).embed_sentence({SENTENCE!r}); "
        "print(json.dumps({'equal': bool(np.array_equal(a, b)), 'shape': list(a.shape)}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT / "src"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"equal": True, "shape": [3, 5, 32]}


# ---------------------------------------------------------------------------------------------- push
def _zoo_like(native: Path, tmp_path: Path, licences: list[str]) -> Path:
    """A folder as `elmokit zoo build` leaves it: the model files, card.json, README.md, and train/ + corpus/."""
    folder = tmp_path / "elmokit-en"
    folder.mkdir()
    for f in native.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    card = {
        "name": "elmokit-en",
        "language": "English",
        "recipe": "en",
        "data": {
            "sources": [
                {"name": f"source-{i}", "folder": f"folder-{i}", "licence": licence}
                for i, licence in enumerate(licences)
            ]
        },
        "figures": {
            "heldout": {"bilm": {"average": 123.45, "forward": 120.0, "backward": 127.0}},
            "wikitext2_test": {"bilm": {"average": 345.6}},
        },
    }
    (folder / "card.json").write_text(json.dumps(card))
    (folder / "README.md").write_text("# elmokit-en: English biLM trained by elmokit\n\nThe zoo's card.\n")
    (folder / "train").mkdir()
    (folder / "train" / "checkpoint.pt").write_bytes(b"x")
    (folder / "corpus").mkdir()
    (folder / "corpus" / "train.txt").write_text("a b c\n")
    return folder


def test_the_card_parses_and_names_the_data_licences(native, tmp_path):
    folder = _zoo_like(native, tmp_path, ["CC BY-SA 4.0", "RESEARCH USE ONLY: (c) Reuters Ltd."])
    card = huggingface_hub.ModelCard(hub_card(folder, "me/elmokit-en"))
    data = card.data
    assert data.library_name == "elmokit"
    assert "elmo" in data.tags and "elmokit" in data.tags
    assert data.language == ["en"]
    assert data.license == "other" and data.license_name == "training-data-licences"
    assert data.to_dict()["training_data"] == [
        {"name": "source-0", "licence": "CC BY-SA 4.0"},
        {"name": "source-1", "licence": "RESEARCH USE ONLY: (c) Reuters Ltd."},
    ]
    results = {r.dataset_type: r.metric_value for r in data.eval_results}
    assert results == {"elmokit-heldout": 123.45, "wikitext": 345.6}
    assert {r.metric_type for r in data.eval_results} == {"perplexity"}
    assert card.text.lstrip().startswith("# elmokit-en: English biLM trained by elmokit")


def test_one_shared_licence_is_the_hubs_licence_id(native, tmp_path):
    folder = _zoo_like(native, tmp_path, ["CC BY-SA 4.0", "cc by-sa 4.0 (UD)"])
    assert huggingface_hub.ModelCard(hub_card(folder, "me/m")).data.license == "cc-by-sa-4.0"


def test_a_converted_folder_gets_a_card_from_its_config(native):
    card = huggingface_hub.ModelCard(hub_card(native, "me/tiny"))
    assert card.data.library_name == "elmokit" and card.data.license is None
    assert "Embedder('me/tiny')" in card.text and "projection 16 (vectors of 32)" in card.text


class _RecordingApi:
    """``HfApi`` up to the network: records each call, sends nothing."""

    calls: list = []

    def __init__(self, token=None, library_name=None, **_):
        self.token = token

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def create_commit(self, repo_id, operations, **kwargs):
        self.calls.append(("create_commit", repo_id, list(operations), kwargs))
        return huggingface_hub.CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/{COMMIT}",
            commit_message=kwargs["commit_message"],
            commit_description="",
            oid=COMMIT,
        )


@pytest.fixture
def recording_api(monkeypatch):
    monkeypatch.setattr(huggingface_hub, "HfApi", _RecordingApi)
    _RecordingApi.calls = []
    return _RecordingApi.calls


def test_push_uploads_the_model_files_and_the_card_in_one_commit(native, tmp_path, recording_api):
    folder = _zoo_like(native, tmp_path, ["CC BY-SA 4.0"])
    url = push_to_hub(folder, "me/elmokit-en", private=True, revision="v1")
    assert url == f"https://huggingface.co/me/elmokit-en/commit/{COMMIT}"
    (kind0, repo0, repo_kwargs), (kind1, _, branch_kwargs), (kind2, repo2, operations, commit_kwargs) = recording_api
    assert (kind0, repo0, repo_kwargs["private"], repo_kwargs["exist_ok"]) == (
        "create_repo",
        "me/elmokit-en",
        True,
        True,
    )
    assert (kind1, branch_kwargs["branch"]) == ("create_branch", "v1")
    assert (kind2, repo2, commit_kwargs["revision"]) == ("create_commit", "me/elmokit-en", "v1")
    sent = {op.path_in_repo: op for op in operations}
    assert sorted(sent) == ["README.md", "card.json", "config.json", "model.safetensors"]  # no train/, corpus/
    assert Path(sent["model.safetensors"].path_or_fileobj) == folder / "model.safetensors"
    readme = sent["README.md"].path_or_fileobj
    assert huggingface_hub.ModelCard(readme.decode()).data.license == "cc-by-sa-4.0"


def test_elmokit_push_and_its_dry_run(native, recording_api, capsys):
    assert cli_main(["push", str(native), "me/tiny", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["files"] == ["README.md", "config.json", "model.safetensors"]
    assert "library_name: elmokit" in plan["metadata"]
    assert recording_api == []
    assert cli_main(["push", str(native), "me/tiny"]) == 0
    assert capsys.readouterr().out.strip() == f"https://huggingface.co/me/tiny/commit/{COMMIT}"
    assert [c[0] for c in recording_api] == ["create_repo", "create_commit"]
    assert recording_api[0][2]["private"] is False


def test_push_refuses_what_is_not_a_native_folder(native, tmp_path):
    (tmp_path / "x.txt").write_text("no model")
    with pytest.raises(UsageError, match="not a native model folder"):
        push_plan(tmp_path, "me/m")
    with pytest.raises(UsageError, match="org/name"):
        push_plan(native, "not-a-repo-id")


def test_the_documented_example(native, offline_cache, recording_api, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(native, tmp_path / "my_model")
    _lay_out_cache(offline_cache, "my-org/elmokit-tiny", native)  # what the push would have put there
    namespace: dict = {}
    exec(
        compile(
            docs_example("how-to/integrations.md", "## Hugging Face Hub"), "docs/how-to/integrations.md (Hub)", "exec"
        ),
        namespace,
    )
    assert capsys.readouterr().out.strip() == f"https://huggingface.co/my-org/elmokit-tiny/commit/{COMMIT}"
    assert [c[0] for c in recording_api] == ["create_repo", "create_commit"]
    got = namespace["embedder"].embed_sentence(SENTENCE)
    np.testing.assert_array_equal(got, Embedder(native).embed_sentence(SENTENCE))
