"""Integrations of elmokit models into other libraries' APIs, each behind its extra: flair (``flair``), the spaCy
component (``spacy``), the Hugging Face Hub upload and card (``hub``; Hub names are resolved in
:mod:`elmokit.weights.hub`), Ray Data's ``EmbedBatches`` (``ray``)."""
