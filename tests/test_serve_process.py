"""``elmokit serve`` as users start it: the bind rule and a port in use (one line, exit 2), and, in a real process,
graceful shutdown (N requests in flight, SIGTERM: every accepted request answered 200, exit 0) with one process and
with ``--workers 2``."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from conftest import REPO_ROOT
from elmokit.cli import main
from serve_helpers import metric, save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("serve_process") / "model")


def _err(capsys) -> str:
    return capsys.readouterr().err


def test_a_public_host_needs_an_api_key_or_insecure_no_auth(model_dir, capsys):
    assert main(["serve", str(model_dir), "--host", "0.0.0.0"]) == 2
    err = _err(capsys)
    assert "elmokit serve: error: --host 0.0.0.0 can be reached from other machines: give --api-key KEY" in err
    assert "--insecure-no-auth" in err and len(err.strip().splitlines()) == 1
    assert main(["serve", str(model_dir), "--api-key", " "]) == 2 and "--api-key is empty" in _err(capsys)
    assert main(["serve", str(model_dir), "--openai-layers", "all"]) == 2
    assert "--openai-layers all gives several vectors" in _err(capsys)
    assert main(["serve", str(model_dir), "--openai-layers", "7", "--port", "0"]) == 2  # found when the model loads
    assert "layers=7 is not a layer of this model" in _err(capsys)


def test_a_port_in_use_is_one_line_before_the_model_loads(model_dir, capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["serve", str(model_dir), "--port", str(port)]) == 2
    err = _err(capsys)
    assert f"elmokit serve: error: cannot listen on 127.0.0.1:{port}: " in err and "choose another --port" in err
    assert main(["serve", str(model_dir / "nope")]) == 2 and "does not exist" in _err(capsys)


def test_without_the_serve_extra_the_command_names_the_install(model_dir, monkeypatch, capsys):
    for key in [k for k in sys.modules if k == "uvicorn" or k.startswith("uvicorn.")]:
        monkeypatch.setitem(sys.modules, key, None)  # import uvicorn now fails
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    monkeypatch.delitem(sys.modules, "elmokit.serving.runner", raising=False)  # imported afresh
    assert main(["serve", str(model_dir)]) == 2
    err = _err(capsys).strip()
    assert err == (
        "elmokit serve: error: elmokit serve (the HTTP server) needs uvicorn, which is not installed: "
        "pip install 'elmokit[serve]'"
    )


def _start(model_dir, *extra: str) -> tuple[subprocess.Popen, str]:
    """``python -m elmokit serve MODEL --port 0 ...``; returns the process and its base URL once /health is 200."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "elmokit", "serve", str(model_dir), "--port", "0", "--threads", "1", *extra],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        m = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
        if m:
            url = m.group(1)
            break
        if not line and proc.poll() is not None:
            raise AssertionError("the server ended: " + "".join(lines))
    else:
        proc.kill()
        raise AssertionError("the server did not announce its port: " + "".join(lines))
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the server never became healthy")


def test_sigterm_answers_every_accepted_request_and_exits_0(model_dir):
    # one sentence per forward pass: 8 requests x 200 sentences keep the loop busy for seconds, so that all 8 are in
    # flight together even when the client threads start slowly on a loaded machine (40 a request was not enough)
    proc, url = _start(model_dir, "--max-batch-sentences", "1", "--max-wait-ms", "0.1")
    try:
        sentences = [f"the river bank number {i} was muddy after the long rain".split() for i in range(200)]
        results: list = [None] * 8

        def ask(i: int) -> None:
            try:
                results[i] = httpx.post(f"{url}/embed", json={"sentences": sentences, "layers": "top"}, timeout=60)
            except Exception as exc:  # noqa: BLE001 — recorded, asserted below
                results[i] = exc

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # all 8 accepted (in flight) before the signal
            if metric(httpx.get(f"{url}/metrics").text, "elmokit_requests_in_flight") == 8:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the 8 requests were never in flight together")
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(60) == 0
        assert [getattr(r, "status_code", r) for r in results] == [200] * 8
        assert all(len(r.json()["data"]) == 200 for r in results)
        with pytest.raises(httpx.TransportError):  # no longer accepting
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_workers_serve_one_port_and_stop_on_sigterm(model_dir):
    proc, url = _start(model_dir, "--workers", "2")
    try:
        r = httpx.post(f"{url}/embed", json={"sentences": [["a", "bank"]], "layers": "top", "pool": "mean"})
        assert r.status_code == 200 and len(r.json()["data"][0]["vectors"]) == 16
        assert httpx.get(f"{url}/info").json()["settings"]["workers"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
