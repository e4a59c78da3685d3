"""Compatibility layers for code written against other ELMo libraries: AllenNLP 0.9's ElmoEmbedder and 2.x's
_ElmoBiLm (allennlp), ELMoForManyLangs (efml), simple_elmo (simple_elmo)."""
