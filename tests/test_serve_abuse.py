"""``elmokit serve`` against hostile or odd requests: each is refused with one line naming the problem (never a 500,
a traceback or a hang), and the server keeps serving. A real server (uvicorn on a loopback port, in a thread) around
the tiny random model."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import numpy as np
import pytest

from elmokit.cli import build_parser
from elmokit.cli.serve import _settings
from elmokit.embedding import Embedder
from elmokit.serving import app as app_module
from elmokit.serving.settings import ServeSettings
from elmokit.weights.native import load_pretrained_bilm
from serve_helpers import metric, running_server, save_tiny_model


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


def test_a_lone_surrogate_is_echoed_escaped_not_a_500(server, embedder):
    client, _ = server
    raw = {"Content-Type": "application/json"}  # JSON's "\ud800" escape: a lone surrogate, which UTF-8 cannot carry
    r = client.post("/embed", content=b'{"sentences": [["bank\\ud800"]], "layers": "top", "pool": "mean"}', headers=raw)
    assert r.status_code == 200 and r.json()["data"][0]["tokens"] == ["bank\ud800"]
    want = embedder.embed_batch([["bank\ud800"]], layers="top", pool="mean")[0]  # the library drops the surrogate
    assert np.allclose(r.json()["data"][0]["vectors"], want, atol=1e-6)
    r = client.post("/similar", content=b'{"word": "a\\ud800", "sentences": [["a\\ud800", "b"]]}', headers=raw)
    assert r.status_code == 200 and r.json()["word"] == "a\ud800"
    r = client.post("/embed", content=b'{"sentences": [["a"]], "\\ud800": 1}', headers=raw)
    assert r.status_code == 422 and r.json()["error"]["param"] == "\ud800"
    assert r.json()["error"]["message"].startswith("unknown field '\\ud800'")


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
