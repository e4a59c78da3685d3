"""``elmokit serve`` in one process: the batcher's rules, each route against the library (``Embedder.embed_batch``
within its documented batch-independence bound, ``elmokit similar --json``), every refusal status with its message,
the official ``openai`` client, a client that disconnects, and metrics that move. The server is real (uvicorn on a
loopback port, in a thread); the model is a tiny random one."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from elmokit.cli import main
from elmokit.embedding import Embedder
from elmokit.embedding.pooling import OutputSpec
from elmokit.serving.batcher import Batcher
from elmokit.serving.settings import ServeSettings
from elmokit.weights.fingerprint import bilm_fingerprint
from elmokit.weights.native import load_pretrained_bilm
from serve_helpers import KEY, SENTENCES, metric, running_server, save_tiny_model, within_bound

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("serve") / "model")


@pytest.fixture(scope="module")
def embedder(model_dir, one_thread):
    return Embedder(load_pretrained_bilm(model_dir))


@pytest.fixture(scope="module")
def server(model_dir, embedder):
    settings = ServeSettings(
        model=str(model_dir),
        max_batch_sentences=4,
        max_batch_tokens=64,
        max_wait_ms=5,
        max_concurrent_requests=3,
        max_client_sentences=20,
        max_tokens_per_sentence=40,
        payload_limit=4000,
        api_key=KEY,
    )
    with running_server(settings, embedder) as (url, state):
        with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
            yield client, state


# ------------------------------------------------------------------------------------------------- the batcher
class _Recorder:
    """An embedder that records each batch it is given (the sentences' first tokens) and returns their lengths."""

    num_layers, output_dim = 3, 2

    def __init__(self):
        self.batches = []

    def embed_batch(self, batch, **options):
        if batch != [["probe"]]:
            self.batches.append([s[0] for s in batch])
        return [np.full(2, float(len(s))) for s in batch]


def test_batcher_splits_by_budget_shares_passes_and_reassembles_in_order():
    rec = _Recorder()
    b = Batcher(rec, max_batch_tokens=12, max_batch_sentences=3, max_wait_ms=1)
    b.start()
    assert b.ready.wait(10)
    b.pause()
    mean, top = OutputSpec.make("top", "mean"), OutputSpec.make("all", "mean")
    # request A: 5 sentences (more than a batch), one of 7 tokens (over the budget with anything else: alone)
    a = b.submit([[f"a{i}"] * n for i, n in enumerate([2, 2, 7, 3, 1])], mean)
    c = b.submit([["c0"] * 2], top)  # another spec: never in A's passes
    d = b.submit([["d0"] * 4], mean)
    b.resume()
    assert [r[0] for r in a.future.result(10)] == [2, 2, 7, 3, 1]  # reassembled in input order
    assert c.future.result(10)[0][0] == 2 and d.future.result(10)[0][0] == 4
    b.stop()
    # 3 sentences at most, B x longest <= 12: a2 (7 tokens) goes alone, C's spec runs apart
    # the oldest sentence's spec, in queue order, every sentence that still fits (a2 waits at the head: next pass)
    assert rec.batches == [["a0", "a1", "a3"], ["a2"], ["a4", "d0"], ["c0"]]


def test_batcher_cancel_drops_queued_sentences_and_stop_fails_the_rest():
    rec = _Recorder()
    b = Batcher(rec, max_batch_tokens=100, max_batch_sentences=2, max_wait_ms=1)
    b.start()
    assert b.ready.wait(10)
    b.pause()
    job = b.submit([["x"]] * 5, OutputSpec.make("top", "mean"))
    assert b.queued == 5 and b.cancel(job) == 5 and b.queued == 0
    assert job.future.cancelled()
    b.resume()
    b.stop()
    assert rec.batches == [] and not b.alive
    with pytest.raises(RuntimeError, match="not running"):
        b.submit([["y"]], OutputSpec.make("top", "mean"))


class _Interrupted(_Recorder):
    """A :class:`_Recorder` whose pass over "stop" raises a BaseException (not an Exception), as a KeyboardInterrupt
    or SystemExit inside a pass would."""

    def embed_batch(self, batch, **options):
        if ["stop"] in batch:
            raise KeyboardInterrupt
        return super().embed_batch(batch, **options)


def test_a_loop_stopped_inside_a_pass_fails_that_pass_and_the_queue():
    """The requests of the pass the loop stopped in are answered too (WorkerStopped, a 503 in the server), not left
    waiting for ever; so are the queued ones."""
    b = Batcher(_Interrupted(), max_batch_tokens=100, max_batch_sentences=2, max_wait_ms=1)
    b.start()
    assert b.ready.wait(10)
    b.pause()
    in_pass = b.submit([["stop"], ["x"]], OutputSpec.make("top", "mean"))
    queued = b.submit([["y"]], OutputSpec.make("top", "mean"))
    b.resume()
    for job in (in_pass, queued):
        with pytest.raises(RuntimeError, match="the inference worker stopped"):
            job.future.result(timeout=10)
    assert isinstance(b.error, KeyboardInterrupt) and not b.alive


def test_a_job_finishing_after_the_event_loop_closed_is_dropped_quietly(model_dir, embedder, caplog):
    """A request cancelled at shutdown leaves its job queued; when the job finishes after the event loop has closed,
    nothing is logged (its answer has nobody to go to)."""
    import asyncio

    settings = ServeSettings(model=str(model_dir))
    with running_server(settings, embedder) as (_, state):
        state.batcher.pause()
        request = type("R", (), {"receive": staticmethod(lambda: asyncio.sleep(3600))})()

        async def cancelled() -> None:
            task = asyncio.ensure_future(state.run(request, [["a", "b"]], OutputSpec.make("top", "mean")))
            await asyncio.sleep(0.05)
            task.cancel()

        asyncio.run(cancelled())  # the loop is closed when run() returns
        assert state.batcher.queued == 1
        state.batcher.resume()
        deadline = time.monotonic() + 10
        while state.batcher.queued and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
    assert "Event loop is closed" not in caplog.text and "Traceback" not in caplog.text


class _SlowRecorder(_Recorder):
    """A :class:`_Recorder` whose passes take 50 ms, recording which loop thread ran each."""

    def __init__(self):
        super().__init__()
        self.threads = []

    def embed_batch(self, batch, **options):
        if batch != [["probe"]]:
            self.threads.append(threading.current_thread().name)
            time.sleep(0.05)
        return super().embed_batch(batch, **options)


def test_batcher_loops_take_fair_shares_of_the_queue_and_answer_each_request():
    rec = _SlowRecorder()
    b = Batcher(rec, max_batch_tokens=1000, max_batch_sentences=64, max_wait_ms=1, loops=2)
    b.start()
    assert b.ready.wait(10)
    deadline = time.monotonic() + 10
    while b._waiting < 2 and time.monotonic() < deadline:  # both loops waiting for work
        time.sleep(0.01)
    b.pause()
    spec = OutputSpec.make("top", "mean")
    jobs = [b.submit([[f"s{i}"] * (1 + i % 3)], spec) for i in range(10)]
    time.sleep(0.01)  # past the oldest sentence's wait
    b.resume()
    assert [job.future.result(10)[0][0] for job in jobs] == [1 + i % 3 for i in range(10)]
    b.stop()
    assert not b.alive
    # two loops waiting: the first takes ceil(10 / 2) = 5 sentences, the second the other 5, at the same time
    assert sorted(rec.batches) == [[f"s{i}" for i in range(5)], [f"s{i}" for i in range(5, 10)]]
    assert sorted(rec.threads) == ["elmokit-inference-0", "elmokit-inference-1"]
    with pytest.raises(ValueError, match="loops must be an int >= 1, got 0"):
        Batcher(rec, loops=0)


# ------------------------------------------------------------------------------------------------- the routes
def test_embed_equals_embed_batch_for_every_option(server, embedder):
    client, _ = server
    for options in (
        {},
        {"layers": "top", "pool": "mean"},
        {"layers": 1, "pool": "max"},
        {"layers": [0.2, 0.3, 0.5]},
        {"layers": "average", "keep_sentence_boundaries": True},
    ):
        r = client.post("/embed", json={"sentences": SENTENCES, **options})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [d["tokens"] for d in data] == SENTENCES
        for d, s in zip(data, SENTENCES):
            want = embedder.embed_batch([s], **options)[0]
            assert d["shape"] == list(want.shape)
            assert within_bound(d["vectors"], want), (options, s)


def test_embed_texts_float16_and_npz(server, embedder):
    client, _ = server
    r = client.post("/embed", json={"texts": ["The bank  raised rates", "a"], "dtype": "float16", "layers": "top"})
    assert r.status_code == 200 and r.json()["data"][0]["tokens"] == ["The", "bank", "raised", "rates"]
    want = embedder.embed_batch([["The", "bank", "raised", "rates"]], layers="top", dtype="float16")[0]
    np.testing.assert_allclose(r.json()["data"][0]["vectors"], want.astype(np.float32), atol=2e-3)
    r = client.post("/embed", json={"sentences": SENTENCES}, headers={"Accept": "application/x-npz"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-npz"
    archive = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert sorted(archive.files, key=int) == [str(i) for i in range(len(SENTENCES))]
    for i, s in enumerate(SENTENCES):
        assert archive[str(i)].dtype == np.float32
        assert within_bound(archive[str(i)], embedder.embed_batch([s])[0])
    r = client.post("/embed", json={"sentences": SENTENCES}, headers={"Accept": "application/x-npy"})
    assert r.status_code == 406 and "application/x-npz" in r.json()["error"]["message"]


def test_openai_client_float_and_base64(server, embedder):
    openai = pytest.importorskip("openai")
    client, _ = server
    oa = openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key=KEY, max_retries=0)
    texts = ["The bank raised interest rates .", "river bank"]
    want = embedder.embed_batch([t.split() for t in texts], layers="average", pool="mean")
    for fmt in ("float", "base64", openai.NOT_GIVEN):  # NOT_GIVEN: the client asks for base64 and decodes it
        out = oa.embeddings.create(model="anything", input=texts, encoding_format=fmt)
        assert [e.index for e in out.data] == [0, 1]
        for e, w in zip(out.data, want):
            vector = np.frombuffer(base64.b64decode(e.embedding), "<f4") if fmt == "base64" else e.embedding
            assert within_bound(vector, w)
        assert out.usage.prompt_tokens == 8 and out.usage.total_tokens == 8
    one = oa.embeddings.create(model="m", input="river bank", encoding_format="float")
    assert within_bound(one.data[0].embedding, want[1])
    with pytest.raises(openai.UnprocessableEntityError, match="input\\[1\\] holds no token"):
        oa.embeddings.create(model="m", input=["a", "  "])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=str(client.base_url) + "/v1", api_key="wrong", max_retries=0).embeddings.create(
            model="m", input="a"
        )


def test_similar_gives_the_numbers_of_elmokit_similar(server, model_dir, tmp_path, capsys):
    client, _ = server
    lines = [
        ("river", "They walked along the bank of the river ."),
        ("money", "The bank raised interest rates ."),
        ("river", "Fishermen sat on the grassy bank , by the bank of the lake ."),
        ("money", "He took money to the bank ."),
    ]
    (tmp_path / "s.txt").write_text("".join(f"{lab}\t{s}\n" for lab, s in lines), encoding="utf-8")
    assert main(["similar", str(model_dir), str(tmp_path / "s.txt"), "--word", "bank", "--labels", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    body = {"word": "bank", "sentences": [s.split() for _, s in lines], "labels": [lab for lab, _ in lines]}
    r = client.post("/similar", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert [(o["start"], o["label"]) for o in got["occurrences"]] == [
        (o["start"], o["label"]) for o in cli["occurrences"]
    ]
    assert list(got["layers"]) == list(cli["layers"]) == ["0 (static)", "1", "2", "average"]
    for name, layer in cli["layers"].items():
        np.testing.assert_allclose(got["layers"][name]["cosine"], layer["cosine"], atol=2e-6)
        for key, value in layer["summary"].items():
            assert got["layers"][name]["summary"][key] == pytest.approx(value, abs=2e-6), (name, key)
    assert np.allclose(got["layers"]["0 (static)"]["cosine"], 1.0, atol=1e-6)  # the context-free layer
    xy = np.array(got["projection"]["layers"]["2"])
    assert xy.shape == (5, 2) and np.abs(xy).max() <= got["projection"]["limit"]
    r = client.post("/similar", json={"word": "lake", "sentences": [["a", "b"]]})
    assert r.status_code == 422 and "'lake' occurs in none of the 1 sentences" in r.json()["error"]["message"]


def test_health_info_page_and_examples(server, embedder):
    client, state = server
    assert httpx.get(f"{client.base_url}/health").json() == {"status": "ok"}  # no key needed
    info = client.get("/info").json()
    assert info["fingerprint"] == bilm_fingerprint(embedder.bilm) and info["dim"] == 16 and info["layers"] == 3
    assert info["limits"]["max_client_sentences"] == 20 and info["settings"]["api_key"] == "required"
    assert info["openai"]["layers"] == "average" and info["openai"]["pool"] == "mean"
    page = httpx.get(f"{client.base_url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html") and "similar" in page.text
    assert "http://" not in page.text.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from elsewhere
    ex = httpx.get(f"{client.base_url}/examples").json()
    assert set(ex) == {"bank", "苹果"} and all(ex[k]["word"] in sum(ex[k]["sentences"], []) for k in ex)


# ------------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (b'{"sentences": [["a", "b"]', None, "not valid JSON at line 1, column 26"),
        (b'[["a"]]', None, "must be a JSON object, got a list"),
        ({"sentences": [["a"], ["b", "  "]]}, "sentences", "sentence 1, token 1 is '  ': empty or whitespace-only"),
        ({"sentences": [["a"], ["b", 3]]}, "sentences", "sentence 1, token 1 is a int (3); tokens must be str"),
        ({"sentences": ["a", "b"]}, "sentences", "element 0 is the string 'a'"),
        ({"sentences": [["a"]] * 21}, "sentences", "sentences holds 21 entries; this server takes at most 20"),
        ({"sentences": [["a"] * 41]}, "sentences", "sentence 0 has 41 tokens; this server takes at most 40"),
        ({"sentences": [["a"]], "pool": "sum"}, "pool", "pool must be one of ('none', 'mean', 'max'), got 'sum'"),
        ({"sentences": [["a"]], "layers": 7}, "layers", "layers=7 is not a layer of this model"),
        ({"sentences": [["a"]], "colour": 1}, "colour", "unknown field 'colour'"),
        ({"texts": ["a"], "tokenizer": "spaces"}, "tokenizer", "tokenizer must be one of"),
        ({"texts": ["a"], "sentences": [["a"]]}, "sentences", "exactly one of 'sentences'"),
    ],
)
def test_bad_requests_are_422_naming_field_and_index(server, body, param, message):
    client, _ = server
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post("/embed", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param and error["code"] == 422


def test_401_without_the_key_and_413_over_the_payload_limit(server):
    client, _ = server
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
        r = httpx.post(f"{client.base_url}/embed", json={"sentences": [["a"]]}, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "missing or wrong API key" in r.json()["error"]["message"]
    assert httpx.get(f"{client.base_url}/metrics").status_code == 401
    r = client.post("/embed", json={"sentences": [["word"] * 30] * 20})
    assert r.status_code == 413 and "over the limit of 4000 bytes (--payload-limit)" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: refused as the body arrives
        for _ in range(10):
            yield b" " * 1000

    r = client.post("/embed", content=chunks())
    assert r.status_code == 413


def test_429_with_retry_after_over_max_concurrent_requests(server):
    client, state = server
    state.batcher.pause()
    try:
        with ThreadPoolExecutor(3) as pool:
            held = [pool.submit(client.post, "/embed", json={"sentences": [["a", "b"]]}) for _ in range(3)]
            deadline = time.monotonic() + 10
            while state.in_flight < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            r = client.post("/embed", json={"sentences": [["a"]]})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert "--max-concurrent-requests 3" in r.json()["error"]["message"]
            state.batcher.resume()
            assert [f.result().status_code for f in held] == [200, 200, 200]
    finally:
        state.batcher.resume()


def test_unknown_routes_and_methods_answer_in_the_error_shape(server):
    client, _ = server
    r = client.get("/embeddings")
    assert (
        r.status_code == 404
        and "GET /embeddings: no such route; the routes are POST /embed" in r.json()["error"]["message"]
    )
    r = client.get("/embed")
    assert r.status_code == 405 and r.json()["error"]["message"].startswith("GET /embed: not allowed")


def test_cors_only_when_asked(server, model_dir, embedder):
    client, _ = server
    preflight = {"Origin": "http://example.org", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in client.options("/embed", headers=preflight).headers
    settings = ServeSettings(model=str(model_dir), api_key=KEY, cors_origins=("http://example.org",))
    with running_server(settings, embedder) as (url, _):
        r = httpx.options(f"{url}/embed", headers={**preflight, "Access-Control-Request-Headers": "authorization"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://example.org"
        r = httpx.post(f"{url}/embed", json={"sentences": [["a"]]}, headers={**AUTH, "Origin": "http://example.org"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://example.org"
        r = httpx.post(f"{url}/embed", json={"sentences": [["a"]]}, headers={"Origin": "http://example.org"})
        assert r.status_code == 401  # CORS lets the browser in, the key is still required; the page can read why
        assert r.headers["access-control-allow-origin"] == "http://example.org"


class _Failing(Embedder):
    """An embedder with a defect: a sentence holding "boom" raises a plain RuntimeError (not an elmokit error)."""

    def embed_batch(self, batch, **options):
        if any("boom" in s for s in batch):
            raise RuntimeError("boom")
        return super().embed_batch(batch, **options)


def test_a_defect_in_an_embedding_route_is_a_500_in_the_error_shape_and_the_server_goes_on(model_dir, caplog):
    """/embed and /v1/embeddings are answered by the outer layer itself (not FastAPI's stack, whose last resort is a
    plain-text "Internal Server Error"): a defect gives the JSON error shape, is logged and counted, and the next
    request is answered."""
    failing = _Failing(load_pretrained_bilm(model_dir))
    with running_server(ServeSettings(model=str(model_dir)), failing) as (url, _):
        r = httpx.post(f"{url}/embed", json={"sentences": [["a", "boom"]]})
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json()["error"] == {
            "message": "POST /embed: internal error (logged)",
            "type": "server_error",
            "param": None,
            "code": 500,
        }
        assert "POST /embed failed" in caplog.text and "RuntimeError: boom" in caplog.text
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "boom"}).status_code == 500
        assert httpx.post(f"{url}/embed", json={"sentences": [["a", "b"]]}).status_code == 200
        text = httpx.get(f"{url}/metrics").text
        assert metric(text, "elmokit_requests_total", route="/embed", status="500") == 1
        assert metric(text, "elmokit_requests_total", route="/embed", status="200") == 1


def test_503_when_the_inference_worker_is_gone(model_dir, embedder):
    with running_server(ServeSettings(model=str(model_dir)), embedder) as (url, state):
        assert httpx.get(f"{url}/health").status_code == 200
        state.batcher.stop()
        r = httpx.get(f"{url}/health")
        assert r.status_code == 503 and r.json() == {"status": "the inference worker stopped"}
        r = httpx.post(f"{url}/embed", json={"sentences": [["a"]]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "not ready" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------------------------- disconnects, metrics
def test_a_client_that_disconnects_has_its_queued_work_dropped(server):
    client, state = server
    before = client.get("/metrics").text
    body = json.dumps({"sentences": [["w", str(i)] for i in range(10)]}).encode()
    state.batcher.pause()
    try:
        host, port = client.base_url.host, client.base_url.port
        with socket.create_connection((host, port)) as sock:
            head = (
                f"POST /embed HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            deadline = time.monotonic() + 10
            while state.batcher.queued < 10 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert state.batcher.queued == 10
        deadline = time.monotonic() + 10
        while state.batcher.queued and time.monotonic() < deadline:  # the server hears the disconnect at once
            time.sleep(0.01)
        assert state.batcher.queued == 0
    finally:
        state.batcher.resume()
    after = client.get("/metrics").text
    assert metric(after, "elmokit_dropped_sentences_total") - metric(before, "elmokit_dropped_sentences_total") == 10
    assert metric(after, "elmokit_embedded_sentences_total") == metric(before, "elmokit_embedded_sentences_total")
    assert metric(after, "elmokit_requests_total", route="/embed", status="499") >= 1


def test_metrics_move_and_requests_share_forward_passes(server):
    client, state = server
    before = client.get("/metrics").text
    state.batcher.pause()
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(client.post, "/embed", json={"sentences": SENTENCES[:2]}) for _ in range(3)]
            deadline = time.monotonic() + 10
            while state.batcher.queued < 6 and time.monotonic() < deadline:
                time.sleep(0.01)
            state.batcher.resume()
            assert [f.result().status_code for f in futures] == [200] * 3
    finally:
        state.batcher.resume()
    after = client.get("/metrics").text

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert moved("elmokit_requests_total", route="/embed", status="200") == 3
    assert moved("elmokit_request_duration_seconds_count", route="/embed", status="200") == 3
    assert moved("elmokit_embedded_sentences_total") == 6
    assert moved("elmokit_batch_sentences_count") == 2 and moved("elmokit_batch_sentences_sum") == 6  # 4 + 2
    assert moved("elmokit_batch_real_tokens_sum") == 3 * (6 + 9)
    assert moved("elmokit_batch_tokens_sum") == 4 * 9 + 2 * 9  # padded: B x longest
    assert moved("elmokit_inference_seconds_count") == 2
    assert metric(after, "elmokit_requests_in_flight") == 0 and metric(after, "elmokit_queue_sentences") == 0


def test_concurrent_clients_get_their_own_answers(server, embedder):
    client, _ = server
    want = embedder.embed_batch(SENTENCES, layers="top", pool="mean")

    def ask(i):
        return client.post("/embed", json={"sentences": [SENTENCES[i]], "layers": "top", "pool": "mean"})

    results = [None] * 12
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, ask(i % 7))) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = [r.status_code for r in results]
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 3
    for i, r in enumerate(results):
        if r.status_code == 200:
            assert within_bound(r.json()["data"][0]["vectors"], want[i % 7])


def test_recent_word_cache_serves_the_same_values_and_counts_hits(model_dir, embedder):
    settings = ServeSettings(model=str(model_dir), recent_word_cache=1000)
    distinct = len({w for s in SENTENCES[:3] for w in s})
    want = embedder.embed_batch(SENTENCES[:3])
    with running_server(settings) as (url, state), httpx.Client(base_url=url, timeout=30) as client:
        assert state.embedder.recent_words is not None and state.embedder.recent_words.capacity == 1000
        assert client.get("/info").json()["settings"]["recent_word_cache"] == 1000
        before = client.get("/metrics").text
        for _ in range(2):  # the second time every word comes from the cache
            answer = client.post("/embed", json={"sentences": SENTENCES[:3]})
            assert answer.status_code == 200
            for d, w in zip(answer.json()["data"], want):
                assert within_bound(d["vectors"], w)
        after = client.get("/metrics").text
    assert metric(after, "elmokit_recent_word_misses_total") - metric(before, "elmokit_recent_word_misses_total") == (
        distinct
    )
    assert metric(after, "elmokit_recent_word_hits_total") - metric(before, "elmokit_recent_word_hits_total") == (
        distinct
    )


def test_two_inference_loops_answer_concurrent_clients_with_their_own_vectors(model_dir, embedder):
    settings = ServeSettings(model=str(model_dir), inference_loops=2, max_batch_sentences=4)
    want = embedder.embed_batch(SENTENCES, layers="top", pool="mean")
    with running_server(settings) as (url, state), httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/info").json()["settings"]["inference_loops"] == 2
        with ThreadPoolExecutor(8) as pool:
            answers = list(
                pool.map(
                    lambda i: client.post(
                        "/embed", json={"sentences": [SENTENCES[i % 7]], "layers": "top", "pool": "mean"}
                    ),
                    range(28),
                )
            )
        assert {thread.name for thread in state.batcher._threads} == {"elmokit-inference-0", "elmokit-inference-1"}
    for i, answer in enumerate(answers):
        assert answer.status_code == 200
        assert within_bound(answer.json()["data"][0]["vectors"], want[i % 7])
