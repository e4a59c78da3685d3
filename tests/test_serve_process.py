"""``elmokit serve`` as users start it: the bind rule and a port in use (one line, exit 2), and, in a real process,
graceful shutdown (N requests in flight, SIGTERM: every accepted request answered 200, exit 0) with one process and
with ``--workers 2``."""

from __future__ import annotations

import json
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
from elmokit.cli import build_parser, main
from elmokit.cli.serve import API_KEY_ENV, _settings
from elmokit.errors import UsageError
from elmokit.serving.settings import is_loopback
from serve_helpers import metric, save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("serve_process") / "model")


def _err(capsys) -> str:
    return capsys.readouterr().err


def test_a_public_host_needs_an_api_key_or_insecure_no_auth(model_dir, capsys):
    assert main(["serve", str(model_dir), "--host", "0.0.0.0"]) == 2
    err = _err(capsys)
    assert "elmokit serve: error: --host 0.0.0.0 can be reached from other machines: give an API key" in err
    assert "--api-key-file PATH, ELMOKIT_API_KEY or --api-key KEY" in err
    assert "--insecure-no-auth" in err and len(err.strip().splitlines()) == 1
    assert main(["serve", str(model_dir), "--api-key", " "]) == 2 and "--api-key is empty" in _err(capsys)
    assert main(["serve", str(model_dir), "--openai-layers", "all"]) == 2
    assert "--openai-layers all gives several vectors" in _err(capsys)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("7", "--openai-layers 7 is not a layer of this model: it has layers 0 (token layer) to 2 (top)"),
        ("-1", "--openai-layers -1: expected all, top, average, a layer number"),
        ("0.5,0.5", "--openai-layers 0.5,0.5: a fixed mix needs one weight per layer"),
    ],
)
def test_a_bad_openai_layers_is_named_as_the_flag(model_dir, capsys, value, message):
    # "layers=7 is not a layer of this model" named a Python argument the user never typed
    assert main(["serve", str(model_dir), "--openai-layers", value, "--port", "0"]) == 2  # 7: found at load
    err = _err(capsys).strip()
    assert err.startswith(f"elmokit serve: error: {message}") and len(err.splitlines()) == 1
    assert "layers=" not in err and "layers '" not in err


_LOOPBACK = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost", "LOCALHOST"]


@pytest.mark.parametrize("host", _LOOPBACK)
def test_every_loopback_address_is_loopback(model_dir, host):
    # 127.0.0.2 and [::1] were refused as "reachable from other machines"
    settings = _settings(build_parser().parse_args(["serve", str(model_dir), "--host", host]))
    assert settings.host == host.strip("[]") and settings.api_key is None
    assert is_loopback(host) and is_loopback("::ffff:127.0.0.1")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "10.0.0.1", "128.0.0.1", "::2", "example.org", "localhost2"])
def test_a_host_that_is_not_loopback_needs_a_key(model_dir, host):
    assert not is_loopback(host)
    with pytest.raises(UsageError, match=r"can be reached from other machines: give an API key"):
        _settings(build_parser().parse_args(["serve", str(model_dir), "--host", host]))
    keyed = _settings(build_parser().parse_args(["serve", str(model_dir), "--host", host, "--api-key", "k"]))
    assert keyed.api_key == "k" and keyed.host == host.strip("[]")


def _parsed(model_dir, *argv: str):
    return _settings(build_parser().parse_args(["serve", str(model_dir), *argv]))


def test_the_api_key_from_a_file_or_the_environment(model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-from-file\n")
    assert _parsed(model_dir).api_key is None
    assert _parsed(model_dir, "--api-key-file", str(key_file), "--host", "0.0.0.0").api_key == "s3cret-from-file"
    monkeypatch.setenv(API_KEY_ENV, " s3cret-from-env ")
    assert _parsed(model_dir, "--host", "0.0.0.0").api_key == "s3cret-from-env"
    # the command line wins over the environment
    assert _parsed(model_dir, "--api-key-file", str(key_file)).api_key == "s3cret-from-file"
    assert _parsed(model_dir, "--api-key", "given").api_key == "given"
    assert _parsed(model_dir).public()["api_key"] == "required"


@pytest.mark.parametrize(
    ("setup", "argv", "message"),
    [
        (None, ["--api-key", "a", "--api-key-file", "{f}"], "give one of --api-key and --api-key-file, not both"),
        (None, ["--api-key-file", "{d}/nope"], "--api-key-file {d}/nope: no such file"),
        ("", ["--api-key-file", "{f}"], "--api-key-file {f} is empty: give a secret string"),
        (" \n\n", ["--api-key-file", "{f}"], "--api-key-file {f} is empty: give a secret string"),
        ("a\nb\n", ["--api-key-file", "{f}"], "--api-key-file {f} holds several lines: the key is one line"),
        (b"\xff\xfe", ["--api-key-file", "{f}"], "--api-key-file {f} is not UTF-8 text"),
        (None, ["--api-key-file", "{d}"], "--api-key-file {d} is a folder: give the file holding the key"),
        ("env:", ["--host", "0.0.0.0"], "ELMOKIT_API_KEY is empty: give a secret string"),  # never serves
    ],
)
def test_a_bad_api_key_source_is_one_line(model_dir, tmp_path, monkeypatch, capsys, setup, argv, message):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    key_file = tmp_path / "key"
    if isinstance(setup, bytes):
        key_file.write_bytes(setup)
    elif setup == "env:":
        monkeypatch.setenv(API_KEY_ENV, "  ")
    elif setup is not None:
        key_file.write_text(setup)
    else:
        key_file.write_text("k")
    fill = {"f": key_file, "d": tmp_path}
    assert main(["serve", str(model_dir), *(a.format(**fill) for a in argv)]) == 2
    err = _err(capsys).strip()
    assert err.startswith("elmokit serve: error: " + message.format(**fill)) and len(err.splitlines()) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_api_key_file_is_one_line(model_dir, tmp_path, capsys):
    key_file = tmp_path / "key"
    key_file.write_text("k")
    key_file.chmod(0)
    assert main(["serve", str(model_dir), "--api-key-file", str(key_file)]) == 2
    assert _err(capsys).strip() == f"elmokit serve: error: --api-key-file {key_file} cannot be read: Permission denied"


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
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # keep the pipe drained
    proc.stderr_lines = lines  # what it logged (read by the thread above)
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


@pytest.mark.parametrize(
    ("extra", "bound"),
    [([], 5.0), (["--shutdown-timeout", "1"], 1.0), (["--workers", "2", "--shutdown-timeout", "1"], 1.0)],
)
def test_a_client_that_never_reads_its_answer_holds_shutdown_only_for_the_bound(model_dir, extra, bound):
    # a client posting a large /embed and never reading the answer held a SIGTERM'd server for as long as it lived
    # ("Waiting for connections to close"); now it gets --shutdown-timeout seconds (default 5) once answered
    proc, url = _start(model_dir, *extra)
    stalled = None
    try:
        port = int(url.rsplit(":", 1)[1])
        assert httpx.get(f"{url}/info").json()["settings"]["port"] == port  # started with --port 0: the bound port
        body = json.dumps({"sentences": [["bank"] * 500] * 64}).encode()  # ~1.5 M numbers: ~15 MB of JSON
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the answer stays unsent
        stalled.connect(("127.0.0.1", port))
        head = f"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        stalled.sendall(head.encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 60
        while metric(httpx.get(f"{url}/metrics").text, "elmokit_requests_total", route="/embed", status="200") < 1:
            assert time.monotonic() < deadline, "the large request was never answered"
            time.sleep(0.05)
        time.sleep(0.2)  # the answer handed to the connection, which holds most of it unsent
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(bound + 30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server still ran {bound + 30:g} s after SIGTERM") from None
        took = time.monotonic() - start
        assert code == 0 and bound * 0.9 <= took <= bound + 30  # the client had its time, then no more
        logged = "".join(proc.stderr_lines)
        assert f"closing 1 connection(s) whose client did not read its answer within {bound:g} s" in logged
        assert stalled.recv(4096).startswith(b"HTTP/1.1 200 OK")  # it was answered; the rest never read
    finally:
        if stalled is not None:
            stalled.close()
        if proc.poll() is None:
            proc.kill()
