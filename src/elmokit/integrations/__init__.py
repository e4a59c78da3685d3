"""Integrations of elmokit models into other libraries' APIs: flair (flair, the `flair` extra)."""
