"""Share a model on the Hugging Face Hub (``pip install 'elmokit[hub]'``, huggingface_hub): :func:`push_to_hub`
(and ``elmokit push MODEL org/name``) uploads a native model folder with a Hub model card; loading it back is
``Embedder("org/name")`` anywhere a model name is taken (:mod:`elmokit.weights.hub`)::

    from elmokit.integrations.hub import push_to_hub
    push_to_hub("elmokit-en", "my-org/elmokit-en")          # a zoo name or a native folder
    Embedder("my-org/elmokit-en@main")                       # elsewhere: fetched into the Hub cache

What is uploaded (:func:`push_plan`): the model files of the folder (``config.json``, ``model.safetensors``, and
``vocab.txt``, ``chars.txt``, ``tokenizer.json``, ``card.json``, ``meta.json``, ``learning_curve.png`` where present;
never a zoo build's ``train/`` and ``corpus/``) and ``README.md``, the card (:func:`hub_card`): YAML metadata that
``huggingface_hub.ModelCard`` reads — ``library_name: elmokit``, ``tags``, ``pipeline_tag: feature-extraction``,
``language``, ``license`` from the training data's licences (the one Hub licence id they all share, else ``other``
with ``license_name: training-data-licences``), ``training_data`` (each source with its licence) and
``model-index`` (the held-out and WikiText-2 perplexities) — then the project's card: the folder's ``README.md`` (a
zoo build writes it from ``card.json``), or a short one built from ``card.json`` / ``config.json``.

The upload is one commit (``HfApi.create_commit``), after ``create_repo(exist_ok=True)`` and, for ``revision``, a
branch of that name (``create_branch(exist_ok=True)``). The token is huggingface_hub's (``HF_TOKEN`` or
``huggingface-cli login``) unless ``token`` is given.

Source: huggingface_hub 0.36 ``HfApi.create_commit`` / ``ModelCardData`` / ``EvalResult``; the Hub's model card
metadata (https://huggingface.co/docs/hub/model-cards).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from elmokit.errors import UsageError, UsageTypeError, import_optional
from elmokit.weights.hub import parse_hub_name
from elmokit.weights.native import CONFIG_NAME, WEIGHTS_NAME, ZOO_MODELS, resolve_model_name

__all__ = ["push_to_hub", "push_plan", "hub_card", "MODEL_FILES", "TAGS"]

#: The files of a model folder that are uploaded (those present; the first two are required).
MODEL_FILES = (
    CONFIG_NAME,
    WEIGHTS_NAME,
    "vocab.txt",
    "chars.txt",
    "tokenizer.json",
    "card.json",
    "meta.json",
    "learning_curve.png",
)
TAGS = ["elmo", "elmokit", "bilm", "contextual-embeddings", "word-embeddings", "feature-extraction"]
#: The card's language names → ISO 639-1 (the Hub's ``language``).
_LANGUAGES = {"english": "en", "chinese": "zh"}
#: Licence texts of the training data (their start, any case) → the Hub's licence ids.
_HUB_LICENCES = (
    (r"cc by-sa 4\.0", "cc-by-sa-4.0"),
    (r"cc by-sa 3\.0", "cc-by-sa-3.0"),
    (r"cc by 4\.0", "cc-by-4.0"),
    (r"cc0", "cc0-1.0"),
    (r"mit\b", "mit"),
    (r"apache[- ]2\.0", "apache-2.0"),
)


def _hub():
    return import_optional("huggingface_hub", "hub", "pushing a model to the Hugging Face Hub")  # optional: hub


def _model_folder(model_dir: str | os.PathLike) -> Path:
    """The native folder of ``model_dir`` (a folder or a zoo name). Raises UsageError for anything else."""
    if not isinstance(model_dir, (str, os.PathLike)):
        raise UsageTypeError(f"model_dir must be a model folder or a zoo name, got {type(model_dir).__name__}")
    folder = Path(resolve_model_name(model_dir))
    if not (folder / CONFIG_NAME).is_file() or not (folder / WEIGHTS_NAME).is_file():
        raise UsageError(
            f"{os.fspath(model_dir)} is not a native model folder ({CONFIG_NAME} + {WEIGHTS_NAME}): only those are "
            "pushed; convert it first with `elmokit convert MODEL OUT` and push OUT"
        )
    return folder


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _hub_licence(text: str) -> str | None:
    lowered = " ".join(text.lower().split())
    for pattern, hub_id in _HUB_LICENCES:
        if re.match(pattern, lowered):
            return hub_id
    return None


def _language(card: dict) -> list[str] | None:
    lang = ZOO_MODELS.get(str(card.get("name", "")).lower()) or _LANGUAGES.get(str(card.get("language", "")).lower())
    return [lang] if lang else None


def _eval_results(hub, card: dict, name: str) -> list:
    """The card's perplexities as Hub ``EvalResult`` rows (held-out split; WikiText-2 test where measured)."""
    figures = card.get("figures") or {}
    rows = []
    for key, dataset, dataset_type in (
        ("heldout", f"held-out split of recipe {card.get('recipe', '?')}", "elmokit-heldout"),
        ("wikitext2_test", "WikiText-2 (test)", "wikitext"),
    ):
        bilm = (figures.get(key) or {}).get("bilm") or {}
        if isinstance(bilm.get("average"), (int, float)):
            rows.append(
                hub.EvalResult(
                    task_type="text-generation",
                    task_name="Language modelling (biLM, average of the two directions)",
                    dataset_type=dataset_type,
                    dataset_name=dataset,
                    metric_type="perplexity",
                    metric_value=float(bilm["average"]),
                    metric_name="perplexity",
                )
            )
    return rows


def _card_data(hub, folder: Path, repo_id: str):
    """The card's metadata (a ``huggingface_hub.ModelCardData``)."""
    card = _read_json(folder / "card.json") or {}
    sources = (card.get("data") or {}).get("sources") or []
    training = [{"name": s.get("name"), "licence": s.get("licence") or "not recorded"} for s in sources]
    ids = {_hub_licence(s["licence"]) for s in training}
    extra = {}
    if len(ids) == 1 and None not in ids:
        licence = ids.pop()
    elif training:
        licence = "other"
        extra = {"license_name": "training-data-licences", "license_link": "README.md"}
    else:
        licence = None
    name = card.get("name") or repo_id.split("/")[-1]
    results = _eval_results(hub, card, name)
    return hub.ModelCardData(
        library_name="elmokit",
        tags=list(TAGS),
        pipeline_tag="feature-extraction",
        language=_language(card),
        license=licence,
        model_name=name if results else None,
        eval_results=results or None,
        training_data=training or None,
        **extra,
    )


def _body(folder: Path, repo_id: str) -> str:
    """The project's card: the folder's README.md, or a short one from card.json / config.json."""
    readme = folder / "README.md"
    if readme.is_file():
        return readme.read_text(encoding="utf-8")
    card = _read_json(folder / "card.json") or {}
    config = _read_json(folder / CONFIG_NAME) or {}
    lines = [f"# {repo_id}", "", "An ELMo biLM in elmokit's native format (config.json + model.safetensors)."]
    if card.get("language"):
        lines[-1] += f" Language: {card['language']}."
    lines += ["", "```python", "from elmokit import Embedder", f"embedder = Embedder({repo_id!r})", "```", ""]
    sources = (card.get("data") or {}).get("sources") or []
    if sources:
        lines += ["## Training data", ""]
        lines += [f"- {s.get('name')}: {s.get('licence') or 'licence not recorded'}" for s in sources]
        lines.append("")
    average = (((card.get("figures") or {}).get("heldout") or {}).get("bilm") or {}).get("average")
    if isinstance(average, (int, float)):
        lines += [f"Held-out perplexity (biLM, average of the two directions): {average:.2f}.", ""]
    lstm = config.get("lstm") or {}
    if lstm:
        lines += [
            f"Configuration (`{CONFIG_NAME}`): {lstm.get('n_layers')} biLSTM layers of {lstm.get('dim')} cells, "
            f"projection {lstm.get('projection_dim')} (vectors of {2 * int(lstm.get('projection_dim') or 0)}).",
            "",
        ]
    return "\n".join(lines)


def hub_card(model_dir: str | os.PathLike, repo_id: str) -> str:
    """The ``README.md`` pushed with ``model_dir`` to ``repo_id``: YAML metadata, then the project's card (see the
    module docstring). ``huggingface_hub.ModelCard(text).data`` reads the metadata back.

    Raises:
        UsageError: not a native model folder, or ``repo_id`` not ``org/name``. MissingExtraError: no huggingface_hub.
    """
    if parse_hub_name(repo_id) is None or "@" in repo_id:
        raise UsageError(f"repo_id must be a Hugging Face Hub repository id, org/name, got {repo_id!r}")
    folder = _model_folder(model_dir)
    hub = _hub()
    data = _card_data(hub, folder, repo_id)
    return f"---\n{data.to_yaml()}\n---\n\n{_body(folder, repo_id).lstrip()}"


def push_plan(model_dir: str | os.PathLike, repo_id: str) -> dict[str, Path | bytes]:
    """What :func:`push_to_hub` uploads: path in the repository → local file, or the bytes of ``README.md``."""
    folder = _model_folder(model_dir)
    plan: dict[str, Path | bytes] = {name: folder / name for name in MODEL_FILES if (folder / name).is_file()}
    plan["README.md"] = hub_card(folder, repo_id).encode("utf-8")
    return plan


def push_to_hub(
    model_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    token: str | None = None,
    commit_message: str | None = None,
) -> str:
    """Upload a native model folder (or a built zoo model, by name) to the Hub repository ``repo_id`` (``org/name``,
    created if missing; ``private`` for a new one), with its model card, in one commit on ``revision`` (a branch,
    created if missing; default the repository's main branch). Returns the commit's URL.

    Raises:
        UsageError: not a native model folder, or ``repo_id`` not ``org/name``. MissingExtraError: no huggingface_hub.
        Errors of huggingface_hub (no network, no token, no write access) as it raises them.
    """
    plan = push_plan(model_dir, repo_id)
    hub = _hub()
    api = hub.HfApi(token=token, library_name="elmokit")
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    operations = [
        hub.CommitOperationAdd(path_in_repo=name, path_or_fileobj=source if isinstance(source, bytes) else str(source))
        for name, source in plan.items()
    ]
    info = api.create_commit(
        repo_id,
        operations,
        commit_message=commit_message or f"Upload {Path(resolve_model_name(model_dir)).name} with elmokit",
        revision=revision,
        repo_type="model",
    )
    return str(getattr(info, "commit_url", info))
