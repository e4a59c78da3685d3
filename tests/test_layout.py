"""The package layout's rules (issue 20): one home per concept, the old module paths as one-release aliases."""
import importlib
import subprocess
import sys
import warnings

import pytest

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "elmokit"
#: one-release alias modules at the root (not counted among the root's modules)
ALIASES = {"pooling": "elmokit.embedding.pooling", "senses": "elmokit.analysis.senses",
           "polysemy": "elmokit.analysis.polysemy", "embed_output": None}


def test_old_module_paths_warn_and_give_the_new_modules():
    for old, new in ALIASES.items():
        sys.modules.pop(f"elmokit.{old}", None)
        with pytest.warns(FutureWarning, match=f"elmokit.{old} moved to elmokit"):
            module = importlib.import_module(f"elmokit.{old}")
        if new is not None:  # the same module object: patching the old name patches the real one
            assert module is importlib.import_module(new)
        sys.modules.pop(f"elmokit.{old}", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from elmokit.embed_output import open_embeddings, sentence_key
        from elmokit.zoo.build import load_tokenizer
        from elmokit.zoo.corpora import split_english
    from elmokit.data.tokenizers import load_tokenizer as new_load, split_english as new_split
    from elmokit.embedding.reader import open_embeddings as new_open, sentence_key as new_key

    assert (open_embeddings, sentence_key, load_tokenizer, split_english) == (new_open, new_key, new_load, new_split)


def test_the_alias_warning_points_at_the_importing_line():
    code = "import elmokit.pooling\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO_ROOT / "src"), "PATH": ""})
    assert res.stderr.startswith("<string>:1: FutureWarning: elmokit.pooling moved to elmokit.embedding.pooling")


def test_the_root_holds_at_most_twelve_modules_and_no_training_alias():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    counted = [m for m in modules if m not in ALIASES]
    assert len(counted) <= 12, counted
    assert not (PACKAGE / "training").exists()
