"""One-release alias: ``python -m elmokit.recipes.zoo`` (``python -m elmokit.zoo`` still runs it)."""

from elmokit.recipes.zoo.corpora import main

raise SystemExit(main())
