"""``python -m elmokit.zoo {en,zh} OUT_DIR``: build a zoo corpus and print its per-source table."""
from elmokit.zoo.corpora import main

raise SystemExit(main())
