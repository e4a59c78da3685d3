"""``elmokit serve`` against hostile or odd requests: each is refused with one line naming the problem (never a 500,
a traceback or a hang), and the server keeps serving. A real server (uvicorn on a loopback port, in a thread) around
the tiny random model."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time

import httpx
import numpy as np
import pytest

from elmokit.cli import build_parser
from elmokit.cli.serve import _settings
from elmokit.embedding import Embedder
from elmokit.serving import app as app_module
from elmokit.serving.schemas import json_bytes, negotiate
from elmokit.serving.settings import ServeSettings
from elmokit.weights.native import load_pretrained_bilm
from serve_helpers import metric, running_server, save_tiny_model

orjson = pytest.importorskip("orjson", reason="the serve extra (pip install 'elmokit[serve]') is not installed")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("serve-abuse") / "model")


@pytest.fixture(scope="module")
def embedder(model_dir, one_thread):
    return Embedder(load_pretrained_bilm(model_dir))


@pytest.fixture(scope="module")
def server(model_dir, embedder):
    settings = ServeSettings(model=str(model_dir), body_timeout_s=0.5, max_occurrences=6, max_response_values=1000)
    with running_server(settings, embedder) as (url, state):
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client, state


def _still_serves(client) -> None:
    r = client.post("/embed", json={"sentences": [["still", "here"]], "layers": "top", "pool": "mean"})
    assert r.status_code == 200 and r.json()["data"][0]["shape"] == [16]


def test_json_nested_too_deeply_is_422_not_500(server):
    client, _ = server
    r = client.post("/embed", content=b"[" * 100_000 + b"]" * 100_000, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"]["message"] == (
        "the request body is JSON nested too deeply (the fields need at most 2 levels of lists)"
    )
    _still_serves(client)


def _partial_post(client, declared: int, sent: bytes) -> socket.socket:
    """A raw connection that declares a ``declared``-byte body and sends only ``sent`` of it."""
    host, port = client.base_url.host, client.base_url.port
    sock = socket.create_connection((host, port), timeout=10)
    head = (
        f"POST /embed HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    )
    sock.sendall(head.encode() + sent)
    return sock


def test_a_stalled_body_is_408_after_the_body_timeout_and_frees_its_slot(server):
    client, state = server
    start = time.monotonic()
    with _partial_post(client, 100, b'{"sente') as sock:
        reply = b""
        while chunk := sock.recv(65536):  # the server answers, then closes the connection
            reply += chunk
    assert 0.4 < time.monotonic() - start < 5
    assert reply.startswith(b"HTTP/1.1 408 ")
    assert b"the request body did not arrive within 0.5 s (--body-timeout)" in reply
    assert state.in_flight == 0
    _still_serves(client)


def test_a_client_gone_while_sending_its_body_is_499_not_a_500(server):
    client, state = server
    before = client.get("/metrics").text
    _partial_post(client, 100, b'{"sente').close()
    deadline = time.monotonic() + 5
    while state.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    after = client.get("/metrics").text
    assert metric(after, "elmokit_requests_total", route="/embed", status="500") == 0
    grew = metric(after, "elmokit_requests_total", route="/embed", status="499")
    assert grew - metric(before, "elmokit_requests_total", route="/embed", status="499") == 1
    _still_serves(client)


def test_similar_refuses_more_occurrences_than_max_occurrences(server):
    client, _ = server
    # before: 4 sentences of 512 "a" made a 2048 x 2048 matrix a layer (79 MB of JSON); 256 of them, 137 GB
    r = client.post("/similar", json={"word": "a", "sentences": [["a", "b", "a"]] * 3 + [["a"]]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "sentences"
    assert r.json()["error"]["message"] == (
        "the word 'a' occurs 7 times; this server compares at most 6 occurrences (--max-occurrences): "
        "send fewer sentences"
    )
    r = client.post("/similar", json={"word": "a", "sentences": [["a", "b", "a"]] * 3})
    assert r.status_code == 200 and len(r.json()["occurrences"]) == 6
    assert client.get("/info").json()["limits"]["max_occurrences"] == 6


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the point of the test
@pytest.mark.parametrize(
    ("options", "param"),
    [({"layers": [1e308, 1e308, 1e308]}, "layers"), ({"layers": [1e5] * 3, "dtype": "float16"}, "layers")],
)
def test_vectors_that_overflow_are_422_not_invalid_json(server, embedder, options, param):
    client, _ = server
    sentences = [["The", "bank", "raised", "rates"]]
    assert not np.isfinite(embedder.embed_batch(sentences, **options)[0]).all()  # what the library gives
    for headers in ({}, {"Accept": "application/x-npz"}):
        r = client.post("/embed", json={"sentences": sentences, **options}, headers=headers)
        assert r.status_code == 422 and r.json()["error"]["param"] == param
        assert r.json()["error"]["message"].startswith("the vectors overflow to inf or NaN with layers=")
    fine = client.post("/embed", json={"sentences": sentences, "layers": [0.5, 0.25, 0.25], "dtype": "float16"})
    assert fine.status_code == 200 and np.isfinite(fine.json()["data"][0]["vectors"]).all()


def test_an_answer_over_max_response_values_is_422_before_any_work(server):
    client, _ = server
    embedded = metric(client.get("/metrics").text, "elmokit_embedded_sentences_total")
    # all 3 layers x 16: 21 tokens are 1008 numbers (over 1000), 20 are 960; pooled, 62 sentences are 992
    r = client.post("/embed", json={"sentences": [["a"] * 21]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "sentences"
    assert r.json()["error"]["message"] == (
        "the answer would hold 1008 numbers (1 sentences; positions × layers × 16); this server returns at most 1000 "
        "per request (--max-response-values): split the request, pool, or ask for fewer layers"
    )
    r = client.post("/embed", json={"texts": ["a " * 19], "keep_sentence_boundaries": True})
    assert r.status_code == 422 and r.json()["error"]["param"] == "texts"  # 19 + 2 positions
    assert (
        metric(client.get("/metrics").text, "elmokit_embedded_sentences_total") == embedded
    )  # refused before any forward pass
    assert client.post("/embed", json={"sentences": [["a"] * 20]}).json()["data"][0]["shape"] == [3, 20, 16]
    assert client.post("/embed", json={"sentences": [["a"] * 62], "layers": "top"}).status_code == 200
    assert client.post("/embed", json={"sentences": [["a"]] * 63, "layers": "top", "pool": "mean"}).status_code == 422


def test_the_bearer_scheme_is_case_insensitive_and_the_key_is_not(model_dir, embedder):
    settings = ServeSettings(model=str(model_dir), api_key="s3cret")
    with running_server(settings, embedder) as (url, _):
        for auth in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret"):
            assert httpx.get(f"{url}/info", headers={"Authorization": auth}).status_code == 200, auth
        for auth in ("Bearer S3CRET", "Basic s3cret", "s3cret", "Bearer", "Bearer s3cret2", ""):
            assert httpx.get(f"{url}/info", headers={"Authorization": auth}).status_code == 401, auth


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": []}, "input", "input is an empty list: give a string or a list of strings"),
        ({"input": [101, 2023]}, "input", "input is a list of integers: token ids are not taken: send the text; "),
        ({"input": ["a b", [101, 2023]]}, "input", "input[1] is a list of integers: token ids are not taken"),
        ({"input": [[]]}, "input", "input[0] is a list of integers"),
        ({"input": ["a", 5]}, "input", "input[1] is a int; input must be a list of strings"),
        ({"input": "a", "model": 5}, "model", "model must be a string, got 5"),
        ({"input": "a", "user": ["x"]}, "user", "user must be a string, got ['x']"),
    ],
)
def test_openai_route_refuses_token_ids_empty_input_and_wrong_types(server, body, param, message):
    client, _ = server
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["message"].startswith(message) and error["param"] == param
    ok = client.post("/v1/embeddings", json={"input": "the bank", "model": "anything", "user": "me"})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 16


_RAW = {"Content-Type": "application/json"}  # JSON's "\ud800" escape: a lone surrogate, which UTF-8 cannot carry


@pytest.mark.parametrize(
    ("route", "body", "param", "named"),
    [
        ("/embed", rb'{"sentences": [["bank\ud800"]], "layers": "top", "pool": "mean"}', "sentences", "[0][0]"),
        ("/embed", rb'{"sentences": [["ok"], ["a", "\ud800"]]}', "sentences", "sentences[1][1] ('\\ud800')"),
        ("/embed", rb'{"texts": ["the bank\udfff rose"]}', "texts", "texts[0]"),
        ("/v1/embeddings", rb'{"input": ["fine", "\udc00bank"]}', "input", "input[1]"),
        ("/similar", rb'{"word": "a\ud800", "sentences": [["a\ud800", "b"]]}', "word", "word ('a\\ud800')"),
        ("/similar", rb'{"word": "a", "sentences": [["a"], ["a"]], "labels": ["x", "y\ud800"]}', "labels", "[1]"),
        ("/embed", rb'{"sentences": [["a"]], "\ud800": 1}', None, "a field name ('\\ud800')"),
    ],
)
def test_a_lone_surrogate_is_refused_by_name_in_strict_json(server, route, body, param, named):
    # it was refused as "empty or whitespace-only" with a hint (empty_tokens='keep') the HTTP API rejects, or echoed
    # in a 200 answer that strict JSON parsers refuse
    client, _ = server
    r = client.post(route, content=body, headers=_RAW)
    assert r.status_code == 422
    error = orjson.loads(r.content)["error"]  # strict: a lone surrogate in the answer would raise here
    message = error["message"]
    assert error["param"] == param and named in message and len(message.splitlines()) == 1
    assert "holds a lone surrogate (U+D" in message and "send valid Unicode text" in message
    assert "empty" not in message and "empty_tokens" not in message
    _still_serves(client)


@pytest.mark.parametrize("token", ["", "  ", "\u3000"])
def test_a_blank_token_is_refused_without_a_library_only_hint(server, token):
    # the library's message ends "or pass empty_tokens='keep'": a field this API refuses as unknown
    client, _ = server
    r = client.post("/embed", json={"sentences": [["a"], ["b", token]]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "sentences"
    assert r.json()["error"]["message"] == (
        f"sentence 1, token 1 is {token!r}: empty or whitespace-only tokens are refused (they are usually tokeniser "
        "padding, and would change their neighbours' vectors): drop them"
    )


def test_a_surrogate_pair_is_one_character_not_refused(server):
    client, _ = server
    r = client.post("/embed", content=rb'{"sentences": [["ok\ud83d\ude00"]], "pool": "mean"}', headers=_RAW)
    assert r.status_code == 200 and orjson.loads(r.content)["data"][0]["tokens"] == ["ok\U0001f600"]


def _shortest_float32(text: str) -> float:
    """``json.loads``' ``parse_float``: assert the number is written as the shortest text that reads back as its
    float32 value (orjson's form of a float32), not a float64 repr such as ``0.10000000149011612``."""
    value = np.float32(text)  # read back as float32
    shortest = np.format_float_scientific(value, unique=True)  # Dragon4: the fewest digits that read back

    def digits(number: str) -> str:
        return number.lower().lstrip("-").split("e")[0].replace(".", "").strip("0")

    assert len(digits(text)) <= len(digits(shortest)), (text, shortest)
    return float(value)


def test_every_number_in_an_answer_is_in_its_shortest_float32_form(server):
    client, _ = server
    answers = [
        client.post("/embed", json={"sentences": [["The", "bank", "rose"]], "layers": "top"}),
        client.post("/embed", json={"texts": ["a bank"], "layers": [0.2, 0.3, 0.5], "dtype": "float16"}),
        client.post("/v1/embeddings", json={"input": ["the river bank", "a bank"]}),
        client.post(
            "/similar", json={"word": "bank", "texts": ["the bank rose", "a bank", "river bank"], "labels": list("aab")}
        ),
    ]
    for r in answers:
        assert r.status_code == 200, r.text
        orjson.loads(r.content)  # strict JSON
        json.loads(r.content, parse_float=_shortest_float32)
    similar = orjson.loads(answers[-1].content)
    assert similar["layers"]["2"]["summary"]["pairs"] == 3 and len(similar["projection"]["layers"]["2"]) == 3


def test_json_bytes_never_writes_invalid_json_or_float64_reprs():
    # the fallback for a string holding a lone surrogate went through json.dumps: escaped surrogates (which strict
    # parsers refuse) and each float32 as its float64 repr (0.1 -> 0.10000000149011612)
    data = {"tokens": ["bank\ud800"], "k\udc00": 1, "vectors": np.array([[0.1, 1 / 3]], dtype=np.float32)}
    out = json_bytes(data)
    assert orjson.loads(out) == {"tokens": ["bank\\ud800"], "k\\udc00": 1, "vectors": [[0.1, 0.33333334]]}
    assert b"0.1," in out and b"0.33333334]" in out
    assert json_bytes({"v": np.float32(0.1)}) == b'{"v":0.1}'


@pytest.mark.parametrize("route", ["/embed", "/similar", "/v1/embeddings"])
def test_an_integer_of_thousands_of_digits_is_422_not_500(server, route):
    client, _ = server
    body = b'{"sentences": [["a"]], "layers": ' + b"9" * 5000 + b"}"
    r = client.post(route, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"]["message"] == "the request body holds an integer too long to read (thousands of digits)"
    _still_serves(client)


def test_the_new_limits_come_from_the_command_line(model_dir):
    argv = ["serve", str(model_dir), "--body-timeout", "2.5", "--max-occurrences", "9", "--max-response-values", "77"]
    settings = _settings(build_parser().parse_args(argv))
    assert (settings.body_timeout_s, settings.max_occurrences, settings.max_response_values) == (2.5, 9, 77)
    defaults = _settings(build_parser().parse_args(["serve", str(model_dir)]))
    assert (defaults.body_timeout_s, defaults.max_occurrences, defaults.max_response_values) == (30.0, 256, 8_000_000)
    assert ServeSettings(model="m").limits() == {**defaults.limits()}


def _spy_where(monkeypatch, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """Wrap the app's functions ``names`` so that each call records (name, "event loop" or "worker thread")."""
    seen: list[tuple[str, str]] = []

    def spy(function):
        def wrapped(*args, **kwargs):
            try:
                asyncio.get_running_loop()
                seen.append((function.__name__, "event loop"))
            except RuntimeError:
                seen.append((function.__name__, "worker thread"))
            return function(*args, **kwargs)

        return wrapped

    for name in names:
        monkeypatch.setattr(app_module, name, spy(getattr(app_module, name)))
    return seen


def test_parsing_and_building_answers_run_off_the_event_loop(server, monkeypatch):
    # tokenising 2 MB of texts, or writing millions of numbers as JSON, on the event loop stalled every other request
    # and /health for seconds; they run in worker threads (here every answer counts as large)
    monkeypatch.setattr(app_module, "INLINE_ANSWER_VALUES", 0)
    client, _ = server
    names = ("parse_embed", "_embed_response", "parse_openai", "parse_similar", "similar_result")
    seen = _spy_where(monkeypatch, names)
    assert client.post("/embed", json={"texts": ["the bank"], "tokenizer": "moses"}).status_code == 200
    assert client.post("/v1/embeddings", json={"input": "the bank"}).status_code == 200
    assert client.post("/similar", json={"word": "bank", "texts": ["the bank", "a bank"]}).status_code == 200
    assert seen == [(name, "worker thread") for name in names]


def test_small_pre_tokenised_requests_stay_on_the_event_loop_and_large_ones_do_not(server, monkeypatch):
    # a one-sentence pooled request: checking it and writing its 2P numbers cost less than two thread hops
    client, _ = server
    seen = _spy_where(monkeypatch, ("parse_embed", "_embed_response"))
    small = {"sentences": [["the", "bank"]], "layers": "top", "pool": "mean"}
    assert client.post("/embed", json=small).status_code == 200
    assert seen == [("parse_embed", "event loop"), ("_embed_response", "event loop")]
    seen.clear()
    monkeypatch.setattr(app_module, "INLINE_BODY_BYTES", 1)
    monkeypatch.setattr(app_module, "INLINE_ANSWER_VALUES", 1)
    assert client.post("/embed", json=small).status_code == 200
    assert seen == [("parse_embed", "worker thread"), ("_embed_response", "worker thread")]


_JSON, _NPZ = "application/json", "application/x-npz"


@pytest.mark.parametrize(
    ("accept", "want"),
    [
        # the cases: q=0 refuses, a lower q loses, an unknown type beside a known one, the case of a type
        ("application/x-npz;q=0, application/json", _JSON),
        ("application/json, application/x-npz;q=0.5", _JSON),
        ("application/x-npy, application/json", _JSON),
        ("APPLICATION/X-NPZ", _NPZ),
        ("Application/X-Npz;Q=0.7, application/json;q=0.6", _NPZ),
        # wildcards, and the most specific range deciding a type's q
        ("*/*", _JSON),
        ("application/*", _JSON),
        ("*/*;q=0.1, application/x-npz", _NPZ),
        ("application/json;q=0, */*", _NPZ),
        ("application/*;q=0, application/x-npz", _NPZ),
        ("text/html, application/x-npz;q=0.2", _NPZ),
        ("application/x-npz, application/json", _NPZ),  # equal q: the one listed first
        (None, _JSON),  # no header: JSON
        # 406 only when nothing offered is acceptable
        ("application/x-npy", 406),
        ("text/html", 406),
        ("application/json;q=0, application/x-npz;q=0", 406),
        ("*/*;q=0", 406),
        ("application/json;q=0", 406),
    ],
)
def test_content_negotiation_follows_rfc_9110(server, accept, want):
    client, _ = server
    headers = {} if accept is None else {"Accept": accept}
    r = client.post("/embed", json={"sentences": [["the", "bank"]], "layers": "top", "pool": "mean"}, headers=headers)
    if want == 406:
        assert r.status_code == 406 and r.json()["error"]["param"] == "accept"
        assert "/embed answers application/json or application/x-npz" in r.json()["error"]["message"]
        return
    assert r.status_code == 200 and r.headers["content-type"] == want
    if want == _NPZ:
        assert np.load(io.BytesIO(r.content), allow_pickle=False)["0"].shape == (16,)
    else:
        assert len(r.json()["data"][0]["vectors"]) == 16


def test_several_accept_lines_count_as_one_list(server):
    client, _ = server
    body = b'{"sentences": [["a"]], "pool": "mean"}'
    headers = [("Content-Type", "application/json"), ("Accept", "text/html"), ("Accept", "application/x-npz;q=0.5")]
    r = client.post("/embed", content=body, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"] == _NPZ


def test_negotiate_parses_the_grammar_and_skips_what_it_cannot_parse():
    offered = (_JSON, _NPZ)
    assert negotiate(["application/x-npz ; q=1.000 ; ext=1"], offered) == _NPZ  # spaces, 3 decimals, an extension
    assert negotiate(["application/x-npz;q=2, application/json;q=0.1"], offered) == _JSON  # q=2 is not a qvalue
    assert negotiate(["application/x-npz;q=abc"], offered) == _JSON  # the only range unparsable: as no header
    assert negotiate(["*/json, application/x-npz;q=0.9"], offered) == _NPZ  # */json is no media range
    assert negotiate(["application/json;q=0.001, application/x-npz;q=0.0001"], offered) == _JSON  # 4 decimals
    assert negotiate(["", " , "], offered) == _JSON
    assert negotiate(["application/xml"], offered) is None
