"""Recipes built on the library, which never imports them: the main job (:mod:`.quickstart`, ``elmokit quickstart``)
and the model zoo (:mod:`.zoo`: its corpora and builds, ``elmokit zoo build``)."""
