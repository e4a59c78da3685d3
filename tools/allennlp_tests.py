"""Run AllenNLP v2.10.1's own ELMo unit tests against elmokit, with only their ELMo imports mapped onto elmokit.

Needs a Python with AllenNLP 2.10.1 installed (../shared/docs/peer-allennlp.md, plus ``pip install nltk scikit-learn
tensorboardX termcolor`` for ``allennlp.common.testing``) and elmokit importable
(``PYTHONPATH=src``), an AllenNLP git directory (the ``fetch`` mirror, or a clone) and the ELMo fixtures
(../shared/fixtures/allennlp-elmo)::

    PYTHONPATH=src /path/to/peer/python tools/allennlp_tests.py --allennlp-git /path/to/allennlp/.git \\
        --fixtures ../shared/fixtures/allennlp-elmo [--side allennlp] [-- pytest options]

The four test files (``tests/modules/elmo_test.py``, ``scalar_mix_test.py``,
``token_embedders/elmo_token_embedder_test.py``, ``tests/data/token_indexers/elmo_indexer_test.py``) are read from
the tag with ``git show`` into a temporary folder (nothing of them is kept in this repository) and run by pytest,
unchanged but for one import line (``ConfigurationError`` → :class:`elmokit.errors.ElmoError`, the base of
elmokit's errors; see ``IMPORTS``). Before they are imported, the names they import from ``allennlp.modules.elmo`` and
``allennlp.modules`` are pointed at elmokit's: ``Elmo`` → :class:`elmokit.Elmo`, ``_ElmoBiLm`` /
``_ElmoCharacterEncoder`` → :mod:`elmokit.compat.allennlp`, ``batch_to_ids`` → :func:`elmokit.batch_to_ids`,
``ScalarMix`` → :class:`elmokit.ScalarMix`; AllenNLP's ``ElmoTokenEmbedder`` builds an elmokit ``Elmo``, and its
``ELMoTokenCharactersIndexer`` maps characters with :class:`elmokit.characters.ByteCharacterMapper`. Everything
else (data pipeline, test base classes, ``SimpleTagger``) stays AllenNLP's. ``--side allennlp`` runs the tests
on AllenNLP itself (the reference); ``--stateful`` builds ``_ElmoBiLm(..., stateful=True)`` (AllenNLP's carried LSTM
state, which ``test_elmo_bilm`` needs). The exit status is pytest's.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

TAG = "v2.10.1"
TEST_FILES = (
    "tests/modules/elmo_test.py",
    "tests/modules/scalar_mix_test.py",
    "tests/modules/token_embedders/elmo_token_embedder_test.py",
    "tests/data/token_indexers/elmo_indexer_test.py",
)
#: import lines of the test files that are rewritten (elmokit's errors share one base class, ElmoError)
IMPORTS = {
    "from allennlp.common.checks import ConfigurationError": (
        "from elmokit.errors import ElmoError as ConfigurationError"
    )
}


def import_allennlp() -> None:
    """Import AllenNLP's ELMo modules as ../shared/docs/peer-allennlp.md says (a stand-in ``torchvision`` while
    they import, when the real one cannot be imported beside this torch)."""
    import spacy  # noqa: F401  # lazy: only in the peer environment
    import transformers  # noqa: F401  # lazy: only in the peer environment

    fake = None
    try:
        import torchvision  # noqa: F401  # lazy: optional in the peer environment
    except Exception:
        fake = sys.modules["torchvision"] = types.ModuleType("torchvision")
    import allennlp.data.token_indexers.elmo_indexer  # noqa: F401  # lazy: only in the peer environment
    import allennlp.modules.elmo  # noqa: F401  # lazy: only in the peer environment
    import allennlp.modules.token_embedders.elmo_token_embedder  # noqa: F401  # lazy: only in the peer environment

    if fake is not None:
        sys.modules.pop("torchvision", None)


def _absent(name: str):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"elmokit.compat.allennlp has no {name}")

    return refuse


def map_onto_elmokit(stateful: bool) -> None:
    """Point the ELMo names AllenNLP's tests import (and the two AllenNLP classes they drive) at elmokit's."""
    import allennlp.modules  # lazy: only in the peer environment
    from allennlp.data.token_indexers import elmo_indexer  # lazy: only in the peer environment
    from allennlp.modules import elmo, scalar_mix  # lazy: only in the peer environment
    from allennlp.modules.token_embedders import elmo_token_embedder  # lazy: only in the peer environment

    import elmokit  # lazy: after AllenNLP, so that the mapping is what the tests see
    from elmokit.characters import ByteCharacterMapper  # lazy: as above
    from elmokit.compat import allennlp as compat  # lazy: as above

    elmo.Elmo = elmo_token_embedder.Elmo = elmokit.Elmo
    for name in ("_ElmoBiLm", "_ElmoCharacterEncoder"):  # absent on older elmokit: those tests fail
        setattr(elmo, name, getattr(compat, name, _absent(name)))
    if stateful:
        elmo._ElmoBiLm = functools.partial(compat._ElmoBiLm, stateful=True)
    elmo.batch_to_ids = elmokit.batch_to_ids
    allennlp.modules.ScalarMix = scalar_mix.ScalarMix = elmokit.ScalarMix

    class Mapper(elmo_indexer.ELMoCharacterMapper):
        """AllenNLP's mapper interface, elmokit's ids."""

        def __init__(self, tokens_to_add=None) -> None:
            super().__init__(tokens_to_add)
            self.elmokit = ByteCharacterMapper(tokens_to_add=tokens_to_add)

        def convert_word_to_char_ids(self, word: str) -> list[int]:
            return self.elmokit.token_to_ids(word)

    elmo_indexer.ELMoCharacterMapper = Mapper


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allennlp-git", required=True, help="AllenNLP's git directory (holding tag v2.10.1)")
    ap.add_argument("--fixtures", required=True, help="../shared/fixtures/allennlp-elmo")
    ap.add_argument("--side", choices=("elmokit", "allennlp"), default="elmokit")
    ap.add_argument("--stateful", action="store_true", help="_ElmoBiLm(..., stateful=True), AllenNLP's default")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = ap.parse_args(argv)
    import pytest  # lazy: a test runner, not a dependency of the tool's import

    import_allennlp()
    if args.side == "elmokit":
        map_onto_elmokit(args.stateful)
    from allennlp.common.testing.test_case import AllenNlpTestCase  # lazy: only in the peer environment

    fixtures = Path(args.fixtures).resolve()
    with tempfile.TemporaryDirectory(prefix="allennlp-tests-") as tmp:
        root = Path(tmp)
        (root / "test_fixtures" / "data").mkdir(parents=True)
        (root / "test_fixtures" / "elmo").symlink_to(fixtures, target_is_directory=True)
        (root / "test_fixtures" / "data" / "conll2003.txt").symlink_to(fixtures / "conll2003.txt")
        AllenNlpTestCase.FIXTURES_ROOT = root / "test_fixtures"
        paths = []
        for name in TEST_FILES:
            text = subprocess.run(
                ["git", "--git-dir", args.allennlp_git, "show", f"{TAG}:{name}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            if args.side == "elmokit":
                for old, new in IMPORTS.items():
                    text = text.replace(old, new)
            path = root / name.replace("/", "__")
            path.write_text(text, encoding="utf-8")
            paths.append(str(path))
        os.chdir(root)  # the tagger config names its files relative to AllenNLP's root
        return pytest.main(["-p", "no:cacheprovider", "--rootdir", tmp, *args.pytest_args, *paths])


if __name__ == "__main__":
    sys.exit(main())
