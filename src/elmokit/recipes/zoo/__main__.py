"""``python -m elmokit.recipes.zoo {en,zh} OUT_DIR``: build a zoo corpus and print its per-source table."""

from elmokit.recipes.zoo.corpora import main

raise SystemExit(main())
