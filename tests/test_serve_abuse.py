"""``elmokit serve`` against hostile or odd requests: each is refused with one line naming the problem (never a 500,
a traceback or a hang), and the server keeps serving. A real server (uvicorn on a loopback port, in a thread) around
the tiny random model."""

from __future__ import annotations

import httpx
import pytest

from elmokit.embedding import Embedder
from elmokit.serving.settings import ServeSettings
from elmokit.weights.native import load_pretrained_bilm
from serve_helpers import running_server, save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("serve-abuse") / "model")


@pytest.fixture(scope="module")
def embedder(model_dir, one_thread):
    return Embedder(load_pretrained_bilm(model_dir))


@pytest.fixture(scope="module")
def server(model_dir, embedder):
    with running_server(ServeSettings(model=str(model_dir)), embedder) as (url, state):
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
