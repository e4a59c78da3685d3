"""Python's error conventions inside the error family (issue 20 item 6): input of the wrong type raises an error that
is also a ``TypeError`` (``InputTypeError`` for model input, ``UsageTypeError`` for arguments), naming the argument and
the form expected; a wrong value stays a ``ValueError`` only (never a ``TypeError``)."""

from __future__ import annotations

import pytest
import torch

from elmokit import BiLM, Elmo, Embedder, ScalarMix, batch_to_ids, elmo_tiny
from elmokit.baselines.ngram import KneserNeyLM
from elmokit.data.corpus import SentenceBatcher, StreamWindows, TextCorpus
from elmokit.embedding.pooling import OutputSpec, parse_layers
from elmokit.errors import ElmoError, InputError, InputTypeError, UsageError, UsageTypeError
from elmokit.modules.softmax import SoftmaxLM
from elmokit.vocabulary import Vocabulary


@pytest.fixture(scope="module")
def bilm():
    torch.manual_seed(0)
    return BiLM(elmo_tiny()).eval()


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "a.txt"
    path.write_text("the bank\nriver bank\n", encoding="utf-8")
    return path


def _type_error(call, match, family=InputTypeError):
    with pytest.raises(TypeError, match=match) as info:
        call()
    assert isinstance(info.value, ElmoError) and isinstance(info.value, family), type(info.value)
    return info.value


def _value_error(call, match, family=(InputError, UsageError)):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert isinstance(info.value, ElmoError) and isinstance(info.value, family)
    assert not isinstance(info.value, TypeError), f"{type(info.value).__name__} is a wrong value, not a wrong type"


@pytest.mark.parametrize(
    "bad,match",
    [
        ("the bank", r"sentences must be a list of sentences, each a list of token strings; got a single string"),
        (["the", "bank"], r"sentences must be a list of sentences.*element 0 is the string 'the': a flat list"),
        (42, r"sentences must be a list of sentences.*got a int"),
        ([["ok"], [1]], r"sentence 1, token 0 is a int \(1\); tokens must be str"),
        ([["ok"], b"bytes"], r"sentences must be a list of sentences.*sentence 1 is a bytes"),
    ],
)
def test_batch_to_ids_wrong_type_is_a_type_error(bad, match):
    _type_error(lambda: batch_to_ids(bad), match)


def test_batch_to_ids_wrong_values_stay_value_errors():
    _value_error(lambda: batch_to_ids([["the", ""]]), r"sentence 0, token 1 is ''")
    _value_error(lambda: batch_to_ids([["a"]], max_characters_per_token=2), r"max_characters_per_token must be >= 3")
    _type_error(
        lambda: batch_to_ids([["a"]], max_characters_per_token=50.0),
        r"max_characters_per_token must be an "
        r"int >= 3, got 50\.0 \(float\)",
        UsageTypeError,
    )
    _type_error(lambda: batch_to_ids([["a"]], char_vocab="abc"), "char_vocab must be a CharVocabulary", UsageTypeError)
    assert batch_to_ids([["the", "bank"]]).shape == (1, 2, 50)  # the right form still works


def test_embedder_sentence_entry_points(bilm):
    embedder = Embedder(bilm)
    _type_error(
        lambda: embedder.embed_sentence("the bank"),
        r"embed_sentence\(tokens\) must be one sentence, a list of token strings; got a single string",
    )
    _type_error(
        lambda: embedder.embed_sentence([["the", "bank"]]),
        r"embed_sentence\(tokens\) must be one sentence.*token 0 is a list",
    )
    _type_error(lambda: embedder.embed_sentence(7), r"embed_sentence\(tokens\) must be one sentence.*got a int")
    _type_error(lambda: list(embedder.embed_sentences("the bank")), "sentences must be a list of sentences")
    _type_error(lambda: list(embedder.embed_sentences(["the", "bank"])), "flat list of tokens is one sentence")
    _type_error(lambda: list(embedder.embed_sentences(5)), r"sentences must be a list of sentences.*got a int")
    _type_error(lambda: embedder.embed_batch("the bank"), "batch must be a list of sentences")
    # wrong values: a blank token, a batch size below 1
    _value_error(lambda: embedder.embed_sentence(["the", " "]), r"sentence 0, token 1 is ' '")
    _value_error(lambda: list(embedder.embed_sentences([["a"]], batch_size=-2)), r"batch_size must be an int >= 1")
    _type_error(
        lambda: list(embedder.embed_sentences([["a"]], batch_size=2.0)),
        r"batch_size must be an int >= 1, "
        r"got 2\.0 \(float\)",
        UsageTypeError,
    )
    assert embedder.embed_sentence(["the", "bank"]).shape == (3, 2, 32)


def test_embedder_constructor_arguments(bilm):
    _type_error(lambda: Embedder(42), "Embedder got a int as its model", UsageTypeError)
    _type_error(lambda: Embedder(bilm, 64), "weight_file is only for an options.json path", UsageTypeError)
    _type_error(lambda: Embedder(bilm, batch_size="8"), "batch_size must be an int >= 1", UsageTypeError)
    _type_error(lambda: Embedder(bilm, char_vocab=["a"]), "char_vocab must be a CharVocabulary", UsageTypeError)
    _value_error(lambda: Embedder(bilm, batch_size=0), "batch_size must be an int >= 1, got 0", UsageError)
    _value_error(lambda: Embedder(bilm, max_batch_tokens=-5), "max_batch_tokens must be an int >= 1", UsageError)


def test_model_entry_points_take_char_ids_tensors(bilm):
    elmo = Elmo(bilm=bilm, num_output_representations=1, dropout=0.0)
    _type_error(lambda: elmo([["the", "bank"]]), r"inputs must be a LongTensor \(B, T, C\) from batch_to_ids")
    _type_error(lambda: elmo(torch.zeros(1, 2, 50)), r"char_ids must be integer ids.*got dtype torch.float32")
    _type_error(lambda: bilm("the bank"), r"char_ids must be a LongTensor \(B, T, C\) from batch_to_ids, got str")
    _type_error(
        lambda: bilm.forward_token_vectors([[0.0]], torch.ones(1, 1, dtype=torch.bool)),
        r"token_vectors must be a float tensor \(B, T, 16\), got list",
    )
    _type_error(
        lambda: bilm.forward_token_vectors(torch.zeros(1, 1, 16, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool)),
        "token_vectors must be floating point",
    )
    _value_error(lambda: elmo(torch.zeros(2, 3, dtype=torch.long)), r"char_ids must have shape \(B, T, 50\)")
    _value_error(lambda: bilm(torch.full((1, 2, 50), 999, dtype=torch.long)), "outside the character table")
    _type_error(
        lambda: Elmo(bilm=bilm, num_output_representations=1.0),
        "num_output_representations must be an int",
        UsageTypeError,
    )
    _type_error(lambda: Elmo(bilm=bilm, dropout="0.5"), r"dropout must be a number in \[0, 1\]", UsageTypeError)
    _value_error(
        lambda: Elmo(bilm=bilm, num_output_representations=0), "num_output_representations must be", UsageError
    )
    _value_error(lambda: Elmo(bilm=bilm, dropout=1.5), r"dropout must be a number in \[0, 1\], got 1.5", UsageError)
    _type_error(lambda: Elmo(module=torch.nn.Linear(2, 2)), "module must be an elmokit BiLM", UsageTypeError)


def test_corpus_and_batchers(corpus_file):
    _type_error(lambda: TextCorpus(42), r"pattern must be a glob pattern or path.*got 42 \(int\)", UsageTypeError)
    _type_error(lambda: TextCorpus([corpus_file, 3]), "pattern must be a glob pattern or path", UsageTypeError)
    _type_error(lambda: TextCorpus(corpus_file, seed=1.5), r"seed must be an int, got 1\.5", UsageTypeError)
    _type_error(lambda: TextCorpus(corpus_file, parts="2"), "parts must be an int >= 1", UsageTypeError)
    _type_error(lambda: SentenceBatcher(42, 2), "corpus must be a TextCorpus or a file pattern", UsageTypeError)
    _type_error(lambda: StreamWindows(corpus_file, 2, 2.5), "unroll_steps must be an int >= 1", UsageTypeError)
    _value_error(lambda: TextCorpus(corpus_file, parts=0), "parts must be an int >= 1, got 0", UsageError)
    _value_error(lambda: TextCorpus(corpus_file, part=2, parts=2), r"part must be an int in \[0, parts=2\)", UsageError)
    _value_error(
        lambda: TextCorpus(corpus_file, max_tokens_per_sentence=0), "max_tokens_per_sentence must be", UsageError
    )
    _value_error(lambda: SentenceBatcher(corpus_file, -1), "batch_size must be an int >= 1, got -1", UsageError)
    assert list(SentenceBatcher(corpus_file, 2)) == [[["the", "bank"], ["river", "bank"]]]


def test_vocabulary_baselines_and_modules():
    vocab = Vocabulary.build([["the", "bank"]])
    _type_error(lambda: Vocabulary("the bank"), "expected a sequence of token strings, got a single str")
    _type_error(lambda: vocab.encode("the bank"), r"encode\(tokens\): expected a list of tokens, got a str")
    _type_error(lambda: Vocabulary.build(["the bank"]), "sentence 0 is a str")
    _type_error(lambda: vocab.id_to_token("1"), "token id must be an int, got str")
    _value_error(lambda: vocab.id_to_token(99), r"token id 99 out of range", InputError)
    _value_error(lambda: Vocabulary.build([["a"]], min_count=0), "min_count must be an int >= 1", UsageError)
    _type_error(lambda: KneserNeyLM(vocab, order=2.0), "order must be an int >= 2", UsageTypeError)
    _type_error(lambda: KneserNeyLM("vocab"), "vocab must be an elmokit Vocabulary", UsageTypeError)
    _value_error(lambda: KneserNeyLM(vocab, order=1), "order must be an int >= 2, got 1", UsageError)
    lm = KneserNeyLM(vocab, order=2).fit([["the", "bank"]])
    _type_error(lambda: lm.target_probs(["the bank"]), "sentence 0 is a str")
    _type_error(lambda: lm.prob("bank", "the"), "context must be a sequence of tokens, got a str")
    _type_error(lambda: ScalarMix(2.0), "mixture_size", UsageTypeError)
    _value_error(lambda: ScalarMix(0), "mixture_size", UsageError)
    head = SoftmaxLM(4, 10)
    _type_error(lambda: head.full_nll([[0.0] * 4], torch.zeros(1, dtype=torch.long)), "h must be a torch.Tensor")
    _type_error(lambda: head.full_nll(torch.zeros(1, 4), torch.zeros(1)), "targets must be an integer tensor")
    _value_error(lambda: head.full_nll(torch.zeros(1, 4), torch.tensor([10])), r"target id 10 out of range")


def test_layer_options():
    _type_error(lambda: parse_layers(None), "layers None: expected all, top, average", UsageTypeError)
    _type_error(lambda: parse_layers(True), "layers True: expected", UsageTypeError)
    _type_error(lambda: parse_layers(["top"]), r"layers \['top'\]: expected", UsageTypeError)
    _value_error(lambda: parse_layers("bottom"), "layers 'bottom': expected", UsageError)
    _value_error(lambda: parse_layers(-1), "a layer number is >= 0", UsageError)
    _type_error(
        lambda: OutputSpec.make(keep_sentence_boundaries="yes"),
        "keep_sentence_boundaries must be True or False",
        UsageTypeError,
    )
