"""Request bodies → checked inputs, and arrays → response bodies, for the routes of :mod:`elmokit.serving.app`.

Every check raises :class:`RequestError` with the HTTP status and one line naming the field (and the sentence and
token index) in the library's wording: the sentence checks are :func:`elmokit.characters.validate_sentences`'s, the
output options :class:`~elmokit.embedding.pooling.OutputSpec`'s. Unknown fields are refused, never ignored.

Binary output is an ``.npz`` archive (``Accept: application/x-npz``): a response holds one array per sentence, of
different lengths unless pooled, and ``.npy`` holds a single array; the archive's members ``"0"``, ``"1"``, … are the
sentences in input order, each ``.npy`` inside (read with ``numpy.load(io.BytesIO(body))``, no pickle).
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from elmokit.characters import is_blank_token, validate_sentences
from elmokit.data.tokenizers import TOKENIZERS, word_tokenizer
from elmokit.embedding.pooling import OutputSpec
from elmokit.errors import ElmoError, import_optional
from elmokit.serving.settings import ServeSettings

__all__ = [
    "RequestError",
    "EmbedRequest",
    "SimilarRequest",
    "NPZ_TYPE",
    "JSON_TYPE",
    "EMBED_TYPES",
    "parse_accept",
    "negotiate",
    "not_acceptable",
    "check_finite",
    "float32_values",
    "parse_json",
    "parse_embed",
    "parse_openai",
    "parse_similar",
    "npz_bytes",
    "json_bytes",
    "base64_vector",
]

#: JSON answers: orjson writes a float32 array's numbers in their shortest float32 form (read back as float32 they
#: are the same values; half the characters of float64's) about 30× faster than ``json.dumps`` of ``tolist()``,
#: whose cost on the event loop capped the pooled one-sentence load (docs/explanation/serving-performance.md)
orjson = import_optional("orjson", "serve", "elmokit serve (the HTTP server)")

NPZ_TYPE = "application/x-npz"
JSON_TYPE = "application/json"

#: RFC 9110's token (§5.6.2) and qvalue (§12.4.2) grammars.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_QVALUE = re.compile(r"(?:0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?)")

_EMBED_FIELDS = ("sentences", "texts", "tokenizer", "layers", "pool", "keep_sentence_boundaries", "dtype")
_OPENAI_FIELDS = ("input", "model", "encoding_format", "user", "dimensions")
_SIMILAR_FIELDS = ("word", "sentences", "texts", "tokenizer", "labels", "match", "context")


class RequestError(Exception):
    """A request the server refuses: ``status`` (401, 408, 413, 422, 429, 503; 500 for a defect), ``message`` (one
    line), ``param`` (the field it names, or ``None``) and ``headers`` (e.g. ``Retry-After``)."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}

    def body(self) -> dict:
        """The JSON error body (the OpenAI error shape, which its client reads)."""
        kind = {401: "authentication_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}
        return {
            "error": {
                "message": self.message,
                "type": kind.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.status,
            }
        }


def _invalid(message: str, param: str | None) -> RequestError:
    return RequestError(422, message, param)


def parse_json(body: bytes) -> dict:
    """The body as a JSON object. Raises :class:`RequestError` 422 naming the position of a syntax error."""
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f" at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise _invalid(f"the request body is not valid JSON{where}: {getattr(exc, 'msg', exc)}", None) from None
    except RecursionError:  # e.g. [[[[…]]]] nested deeper than the parser's recursion limit
        raise _invalid(
            "the request body is JSON nested too deeply (the fields need at most 2 levels of lists)", None
        ) from None
    except ValueError:  # an integer literal longer than Python reads (sys.get_int_max_str_digits(), 4300 digits)
        raise _invalid("the request body holds an integer too long to read (thousands of digits)", None) from None
    if not isinstance(value, dict):
        raise _invalid(f"the request body must be a JSON object, got a {type(value).__name__}", None)
    if _SURROGATE_ESCAPE.search(body):  # only JSON's \uXXXX escapes can bring one (UTF-8 cannot encode it)
        try:
            _refuse_lone_surrogates(value)
        except RecursionError:  # nested almost as deep as the parser reads
            raise _invalid(
                "the request body is JSON nested too deeply (the fields need at most 2 levels of lists)", None
            ) from None
    return value


#: A JSON escape of a UTF-16 surrogate (``\ud800``–``\udfff``): a pair of them is one character, a lone one none.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_lone_surrogates(value: object, where: str = "") -> None:
    """Raise :class:`RequestError` 422 at the first string (a field name or value, at any depth) holding a lone
    surrogate: half of a UTF-16 pair, not a character, which no tokenizer, model or UTF-8 answer can carry."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        path = f"{where}[{key}]" if not isinstance(key, str) else f"{where}.{key}" if where else key
        for text, what in ((key, "a field name"), (item, path)):
            found = _LONE_SURROGATE.search(text) if isinstance(text, str) else None
            if found is not None:
                field = None if what == "a field name" else str(path).split(".")[0].split("[")[0]
                shown = text if len(text) <= 40 else text[:37] + "..."
                what = what if len(what) <= 60 else what[:57] + "..."
                raise _invalid(
                    f"{what} ({shown!r}) holds a lone surrogate (U+{ord(found.group()):04X} at character "
                    f"{found.start()}), half of a UTF-16 pair and not a character: send valid Unicode text",
                    field,
                )
        _refuse_lone_surrogates(item, str(path))


def _check_fields(body: dict, allowed: Sequence[str]) -> None:
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise _invalid(f"unknown field {unknown[0]!r}: the fields are {', '.join(allowed)}", unknown[0])


def _tokenize_texts(texts: object, tokenizer: object, field: str, settings: ServeSettings) -> list[list[str]]:
    """``texts`` (a list of strings) → token lists with ``tokenizer``. Raises :class:`RequestError` 422."""
    if tokenizer not in TOKENIZERS:
        raise _invalid(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}", "tokenizer")
    if not isinstance(texts, list):
        raise _invalid(f"{field} must be a list of strings, got a {type(texts).__name__}", field)
    _check_count(len(texts), field, settings)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise _invalid(f"{field}[{i}] is a {type(text).__name__}; {field} must be a list of strings", field)
    try:
        tokenize = word_tokenizer(str(tokenizer))
    except ElmoError as exc:  # a tokenizer whose library this server lacks
        raise _invalid(str(exc), "tokenizer") from None
    return [tokenize(text) for text in texts]


def _check_count(n: int, field: str, settings: ServeSettings) -> None:
    if n > settings.max_client_sentences:
        raise _invalid(
            f"{field} holds {n} entries; this server takes at most {settings.max_client_sentences} per request "
            "(--max-client-sentences): split the request",
            field,
        )


def _sentences(body: dict, settings: ServeSettings) -> tuple[list[list[str]], str]:
    """The request's sentences (given, or ``texts`` tokenised) and the field they came from."""
    if ("sentences" in body) == ("texts" in body):
        raise _invalid("give exactly one of 'sentences' (token lists) and 'texts' (strings)", "sentences")
    if "texts" in body:
        sentences = _tokenize_texts(body["texts"], body.get("tokenizer", settings.tokenizer), "texts", settings)
        field = "texts"
    else:
        if "tokenizer" in body:
            raise _invalid("'tokenizer' goes with 'texts'; 'sentences' are already token lists", "tokenizer")
        sentences, field = body["sentences"], "sentences"
        if isinstance(sentences, list):
            _check_count(len(sentences), field, settings)
    try:
        sentences = validate_sentences(sentences, name=field, empty_tokens="keep")  # blank tokens: below
    except ElmoError as exc:
        raise _invalid(str(exc), field) from None
    for i, sentence in enumerate(sentences):
        for j, token in enumerate(sentence):
            if is_blank_token(token):  # the library's hint, empty_tokens='keep', is no field of this API
                raise _invalid(
                    f"sentence {i}, token {j} is {token[:10]!r}: empty or whitespace-only tokens are refused (they "
                    "are usually tokeniser padding, and would change their neighbours' vectors): drop them",
                    field,
                )
        if len(sentence) > settings.max_tokens_per_sentence:
            raise _invalid(
                f"sentence {i} has {len(sentence)} tokens; this server takes at most "
                f"{settings.max_tokens_per_sentence} per sentence (--max-tokens-per-sentence)",
                field,
            )
    return [list(s) for s in sentences], field


@dataclass(frozen=True)
class EmbedRequest:
    """A checked ``/embed`` (or ``/v1/embeddings``) request: its token lists and output spec."""

    sentences: list[list[str]]
    spec: OutputSpec


def parse_embed(body: dict, settings: ServeSettings, num_layers: int, dim: int) -> EmbedRequest:
    """A ``/embed`` body → :class:`EmbedRequest` for a model of ``num_layers`` (L+1) layers of ``dim`` (2P) values.
    Raises :class:`RequestError` 422 naming the field, also when the answer would hold more than
    ``settings.max_response_values`` numbers."""
    _check_fields(body, _EMBED_FIELDS)
    sentences, field = _sentences(body, settings)
    options = {k: body[k] for k in ("layers", "pool", "keep_sentence_boundaries", "dtype") if k in body}
    try:
        spec = OutputSpec.make(**options, num_layers=num_layers)
    except ElmoError as exc:
        named = [k for k in options if str(exc).startswith(k)]
        raise _invalid(str(exc), named[0] if named else next(iter(options), None)) from None
    _check_response_size(sentences, field, spec, num_layers, dim, settings)
    return EmbedRequest(sentences, spec)


def _check_response_size(
    sentences: list[list[str]], field: str, spec: OutputSpec, num_layers: int, dim: int, settings: ServeSettings
) -> None:
    """Refuse (422) an answer of more than ``max_response_values`` numbers: the sentences' positions (1 when pooled;
    +2 with the boundaries) × the layers returned × ``dim``. (256 sentences of 512 tokens, all layers of a 1024-wide
    model, from a 0.5 MB body: 400 million numbers, gigabytes of JSON.)"""
    per_position = (num_layers if spec.layers.kind == "all" else 1) * dim
    extra = 2 if spec.keep_sentence_boundaries else 0
    values = sum(1 if spec.pool != "none" else len(s) + extra for s in sentences) * per_position
    if values > settings.max_response_values:
        raise _invalid(
            f"the answer would hold {values} numbers ({len(sentences)} sentences; positions × layers × {dim}); this "
            f"server returns at most {settings.max_response_values} per request (--max-response-values): split the "
            "request, pool, or ask for fewer layers",
            field,
        )


def parse_openai(body: dict, settings: ServeSettings, spec: OutputSpec, dim: int) -> tuple[EmbedRequest, str, str]:
    """A ``/v1/embeddings`` body → (request under ``spec``, model name asked, encoding format). ``input`` is a string
    or a list of strings, tokenised with the server's tokenizer; ``dimensions``, when given, must be the model's
    width."""
    _check_fields(body, _OPENAI_FIELDS)
    if "input" not in body:
        raise _invalid("'input' is required: a string or a list of strings", "input")
    texts = body["input"]
    texts = [texts] if isinstance(texts, str) else texts
    _check_openai_input(texts, settings)
    for name in ("model", "user"):
        if not isinstance(body.get(name, ""), str):
            raise _invalid(f"{name} must be a string, got {body[name]!r}", name)
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise _invalid(f"encoding_format must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    if body.get("dimensions") not in (None, dim):
        raise _invalid(
            f"dimensions: this model's vectors have {dim} dimensions, got {body['dimensions']!r}", "dimensions"
        )
    sentences = _tokenize_texts(texts, settings.tokenizer, "input", settings)
    for i, s in enumerate(sentences):
        if not s:
            raise _invalid(f"input[{i}] holds no token (an empty or whitespace-only string)", "input")
        if len(s) > settings.max_tokens_per_sentence:
            raise _invalid(
                f"input[{i}] has {len(s)} tokens; this server takes at most {settings.max_tokens_per_sentence} "
                "(--max-tokens-per-sentence)",
                "input",
            )
    return EmbedRequest(sentences, spec), str(body.get("model", "")), fmt


def _check_openai_input(texts: object, settings: ServeSettings) -> None:
    """Refuse (422) an empty ``input`` list and token-id arrays (OpenAI's integer form: this server tokenises the
    strings itself)."""
    if texts == []:
        raise _invalid("input is an empty list: give a string or a list of strings", "input")
    ids = "token ids are not taken: send the text; this server tokenises it (--tokenizer {})"
    if isinstance(texts, list) and texts and all(isinstance(t, int) and not isinstance(t, bool) for t in texts):
        raise _invalid("input is a list of integers: " + ids.format(settings.tokenizer), "input")
    for i, text in enumerate(texts if isinstance(texts, list) else []):
        if isinstance(text, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in text):
            raise _invalid(f"input[{i}] is a list of integers: " + ids.format(settings.tokenizer), "input")


@dataclass(frozen=True)
class SimilarRequest:
    """A checked ``/similar`` request (as ``elmokit similar``'s input): word, token lists, labels, match, context."""

    word: str
    sentences: list[list[str]]
    labels: list[str] | None
    match: str
    context: int | None


def parse_similar(body: dict, settings: ServeSettings) -> SimilarRequest:
    """A ``/similar`` body → :class:`SimilarRequest` (``labels``: one string per sentence, or absent)."""
    _check_fields(body, _SIMILAR_FIELDS)
    word = body.get("word")
    if not isinstance(word, str) or not word or word != word.strip() or len(word.split()) != 1:
        raise _invalid(f"word must be one word without whitespace, got {word!r}", "word")
    sentences, _ = _sentences(body, settings)
    labels = body.get("labels")
    if labels is not None:
        if not isinstance(labels, list) or len(labels) != len(sentences):
            n = len(labels) if isinstance(labels, list) else type(labels).__name__
            raise _invalid(f"labels must be a list of one string per sentence ({len(sentences)}), got {n}", "labels")
        for i, label in enumerate(labels):
            if not isinstance(label, str) or not label.strip():
                raise _invalid(f"labels[{i}] must be a non-empty string, got {label!r}", "labels")
    match = body.get("match", "auto")
    if match not in ("auto", "token", "span"):
        raise _invalid(f"match must be one of ('auto', 'token', 'span'), got {match!r}", "match")
    context = body.get("context")
    if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context < 0):
        raise _invalid(f"context must be an int >= 0 or null, got {context!r}", "context")
    return SimilarRequest(word, sentences, labels, match, context)


def parse_accept(values: Sequence[str]) -> list[tuple[str, str, float]] | None:
    """The ``Accept`` header's field values (several field lines count as one list, RFC 9110 §5.3) → its media
    ranges as ``(type, subtype, q)``, lower-cased (media types are case-insensitive), in the order sent; ``None`` when
    there is no header or it lists nothing (every type acceptable).

    A range is ``type/subtype`` (``*/*`` and ``type/*`` included) with optional parameters; ``q`` (0 to 1, at most 3
    decimals, default 1; its name in any case) is its weight, and the parameters other than ``q`` are not used to
    match (this server's types have none). An element that does not follow the grammar (``text``, ``*/json``,
    ``q=2``, ``q=abc``) is skipped, as RFC 9110 lets a server do with what it cannot parse."""
    ranges = []
    for element in ",".join(values).split(","):
        media, *params = (part.strip() for part in element.split(";"))
        if not media and not params:
            continue  # an empty list element ("a, , b")
        kind, slash, sub = media.partition("/")
        if not (slash and _TOKEN.fullmatch(kind) and _TOKEN.fullmatch(sub)) or (kind == "*" and sub != "*"):
            continue
        q = 1.0
        for param in params:
            name, eq, value = param.partition("=")
            if name.strip().lower() == "q":
                q = float(value.strip()) if eq and _QVALUE.fullmatch(value.strip()) else -1.0
                break  # what follows q are accept-extensions
        if q >= 0:
            ranges.append((kind.lower(), sub.lower(), q))
    return ranges or None


def negotiate(values: Sequence[str], offered: Sequence[str]) -> str | None:
    """The media type of ``offered`` (in the server's order of preference) to answer with, given the request's
    ``Accept`` field values (RFC 9110 §12.5.1); ``None`` when none is acceptable (406).

    Each offered type takes the q of the most specific range that matches it (``type/subtype`` over ``type/*`` over
    ``*/*``), so ``application/json;q=0, */*`` refuses JSON and accepts anything else; a type no range matches, or
    whose range has ``q=0``, is not acceptable. The highest q wins; between equal q, the more specific range, then
    the one listed first, then the server's order. No header (or an empty one): the first offered type."""
    ranges = parse_accept(values)
    if ranges is None:
        return offered[0] if offered else None
    best, best_key = None, None
    for preference, media in enumerate(offered):
        kind, _, sub = media.lower().partition("/")
        match = None  # (specificity, -position, q) of the most specific range that matches
        for position, (rkind, rsub, q) in enumerate(ranges):
            specificity = 2 if (rkind, rsub) == (kind, sub) else 1 if (rkind, rsub) == (kind, "*") else 0
            if specificity == 0 and (rkind, rsub) != ("*", "*"):
                continue
            if match is None or specificity > match[0]:
                match = (specificity, -position, q)
        if match is None or match[2] <= 0:
            continue
        key = (match[2], match[0], match[1], -preference)
        if best_key is None or key > best_key:
            best, best_key = media, key
    return best


#: What ``/embed`` answers in, by preference (RFC 9110 content negotiation on ``Accept``: :func:`negotiate`).
EMBED_TYPES = (JSON_TYPE, NPZ_TYPE)


def not_acceptable(accept: list[str]) -> RequestError:
    """406 for an ``Accept`` that rules out both of ``/embed``'s types (``.npy`` named: it is not offered)."""
    asked = ", ".join(f"{kind}/{sub}" + (f";q={q:g}" if q != 1 else "") for kind, sub, q in parse_accept(accept) or ())
    why = "binary output is an .npz archive" if "application/x-npy" in asked else f"Accept lists {asked}"
    return RequestError(
        406, f"{why}: /embed answers {JSON_TYPE} or {NPZ_TYPE} (send 'Accept: {NPZ_TYPE}' for the archive)", "accept"
    )


def check_finite(arrays: list[np.ndarray], spec: OutputSpec) -> None:
    """Raise 422 when an output holds inf or NaN (JSON cannot carry them): a fixed mix's weights, or float16's range,
    too small for the values."""
    if all(np.isfinite(a).all() for a in arrays):
        return
    options = spec.settings()
    raise RequestError(
        422,
        f"the vectors overflow to inf or NaN with layers={options['layers']} and dtype={options['dtype']}: use smaller "
        "mix weights (float32 holds values up to 3.4e38, float16 up to 65504)",
        "layers" if spec.layers.kind == "mix" else "dtype",
    )


def float32_values(summary: dict) -> dict:
    """A summary's floats as float32 scalars, so that the answer writes them in the shortest float32 form, as every
    number the server sends (counts stay ints, absent values ``None``)."""
    return {k: np.float32(v) if isinstance(v, float) else v for k, v in summary.items()}


def npz_bytes(arrays: Sequence[np.ndarray]) -> bytes:
    """The arrays as an uncompressed ``.npz`` archive, members ``"0"``, ``"1"``, … in order."""
    buffer = io.BytesIO()
    np.savez(buffer, **{str(i): a for i, a in enumerate(arrays)})
    return buffer.getvalue()


def json_bytes(data: object) -> bytes:
    """``data`` as compact UTF-8 JSON; NumPy arrays (C-contiguous float32 or float16) and scalars as their values in
    shortest round-trip form. A string holding a lone surrogate (which UTF-8, hence valid JSON text, cannot carry;
    requests holding one are refused before, so only a defect gets here) goes out with it written as the six
    characters ``\\udXXX``: an answer is always valid JSON, and its numbers always orjson's."""
    try:
        return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # orjson: "str is not valid UTF-8: surrogates not allowed"
        return orjson.dumps(_without_surrogates(data), option=orjson.OPT_SERIALIZE_NUMPY)


def _without_surrogates(value: object) -> object:
    """``value`` with every string's lone surrogates written out as ``\\udXXX`` text (dict keys included)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_surrogates(v) for v in value]
    return value


def base64_vector(vector: np.ndarray) -> str:
    """A vector as the OpenAI API's ``base64`` encoding: little-endian float32 bytes, base64."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
