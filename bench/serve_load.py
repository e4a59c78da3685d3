"""Load test of ``elmokit serve`` on loopback, against the offline ``Embedder`` in the same run.

Random weights of the released "small" configuration (LSTM 1024 → 128, output 256) are saved to a temporary folder;
the sentences are the first ``--sentences`` of UD English-EWT dev (``../shared/data/ud-english-ewt``, read by
``bench/inference.py``'s reader). The run, in order:

1. offline: ``Embedder.embed_sentences`` (batch 64, length-sorted) over the sentences, once pooled (``layers=average,
   pool=mean``) and once all layers, in this process with ``--threads`` torch threads: real tokens/s, the best of
   three passes — with the default ``Embedder`` and (``*_recent``) with one that keeps the server's
   ``--recent-word-cache`` words, timed after a first pass (every word kept, as in a server that has seen them);
   then, with one torch thread and that cache, ``Embedder.embed_batch`` on unsorted groups of ``--pass-sizes``
   sentences (``passes_one_thread``): what a bigger pass gains per token before any HTTP work, which bounds the
   dynamic-batching ratio of step 3;
2. ``elmokit serve`` (a child process on loopback, port 0, with ``--inference-loops`` = ``--threads`` loops of
   ``--server-threads 1`` torch thread each — as many cores as offline — and its default ``--recent-word-cache``)
   driven by ``--clients`` concurrent clients for
   ``--seconds`` each, one sentence a request (``--sentences-per-request K``: K consecutive sentences, as a client
   embedding a document sends them; ``1,8``: the phase once per K), with three outputs: pooled JSON (``/embed``
   average + mean), all-layer binary (``Accept: application/x-npz``) and all-layer JSON;
3. the same server with ``--max-batch-sentences 1`` (no dynamic batching), pooled, once per K;
4. ``--overload-clients`` clients against ``--max-concurrent-requests --overload-limit``, pooled: only 200 and 429
   may come back (a client honours ``Retry-After``), no time-outs.

Each load phase is bounded by ``--seconds`` and ``--max-requests``; requests time out after ``--timeout`` s. The clients
are plain asyncio HTTP/1.1 keep-alive connections (no HTTP library: the clients share the machine with the server, so
they must cost little). Reported per phase: real tokens/s of the 200 answers, requests/s, latency p50/p95/p99 (ms),
responses by status, time-outs and connection errors, the server's peak RSS (VmHWM, MB), the CPU the server and the
clients used (cores busy on average: user + system seconds ÷ wall seconds); and the ratios to offline.

Run (on a quiet machine; the figures of issue 23)::

    python bench/serve_load.py --clients 32 --seconds 60 --threads 2 --sentences-per-request 1,8

A short check that it works: ``python bench/serve_load.py --clients 4 --seconds 2 --sentences 200 --overload-clients
32 --overload-limit 8``. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from inference import EWT_DEV, ROOT, read_conllu_forms  # noqa: E402  (the same sentences as bench/inference.py)

HOST = "127.0.0.1"  # loopback only


# ---------------------------------------------------------------------------------------------- the model, offline
def make_model(folder: Path, seed: int = 0) -> Path:
    """Random "small"-configuration weights (random biases) saved in elmokit's format."""
    import torch

    from elmokit import elmo_small
    from elmokit.modules.bilm import BiLM
    from elmokit.weights.native import save_pretrained

    torch.manual_seed(seed)
    model = BiLM(elmo_small())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name:
                p.uniform_(-0.1, 0.1)
    return save_pretrained(model, folder)


def offline(
    model_dir: Path, sentences: list[list[str]], threads: int, recent_word_cache: int, repeats: int = 3
) -> dict:
    """Real tokens/s of ``Embedder.embed_sentences`` (batch 64), pooled and all layers (one warm-up batch first):
    the default ``Embedder``, and (``*_recent``) one with the server's ``recent_word_cache``, timed after a first
    pass over the sentences (every word already kept, as in a server that has seen them). Each figure is the best of
    ``repeats`` timed passes (a pass takes 1.5–3.5 s, and one slow pass on a shared machine would flatter every
    ratio to offline)."""
    import torch

    from elmokit import Embedder, load_pretrained_bilm

    torch.set_num_threads(threads)
    bilm = load_pretrained_bilm(model_dir)
    tokens = sum(len(s) for s in sentences)
    out = {}
    for suffix, cache in (("", 0), ("_recent", recent_word_cache)):
        if suffix and not cache:
            continue
        embedder = Embedder(bilm, recent_word_cache=cache)
        for name, options in (("pooled", {"layers": "average", "pool": "mean"}), ("all_layers", {})):
            list(embedder.embed_sentences(sentences if cache else sentences[:64], 64, **options))
            passes = []
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in embedder.embed_sentences(sentences, 64, **options):
                    pass
                passes.append(time.perf_counter() - start)
            seconds = min(passes)
            out[name + suffix] = {
                "tokens_per_s": tokens / seconds,
                "seconds": seconds,
                "tokens": tokens,
                "passes_tokens_per_s": [round(tokens / t) for t in passes],
            }
    return out


def pass_sizes(
    model_dir: Path, sentences: list[list[str]], recent_word_cache: int, sizes: tuple[int, ...], repeats: int = 3
) -> dict:
    """What dynamic batching can gain before any HTTP work: real tokens/s of ``Embedder.embed_batch`` (pooled) on
    consecutive, unsorted groups of ``size`` sentences (as requests arrive), one torch thread (as one server inference
    loop), with the server's ``recent_word_cache`` filled by a first pass; the best of ``repeats`` passes over the
    first 600 sentences, for each size. The ratio of a size to size 1 bounds the server's ``dynamic_vs_batch1`` at
    that batch size (the server adds the same HTTP work per request to both)."""
    import torch

    from elmokit import Embedder, load_pretrained_bilm

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        embedder = Embedder(load_pretrained_bilm(model_dir), recent_word_cache=recent_word_cache)
        part = sentences[:600]
        tokens = sum(len(s) for s in part)
        for i in range(0, len(part), 64):  # every word kept, as in a server that has seen them
            embedder.embed_batch(part[i : i + 64], layers="average", pool="mean")
        out: dict = {}
        for size in sizes:
            passes = []
            for _ in range(repeats):
                start = time.perf_counter()
                for i in range(0, len(part), size):
                    embedder.embed_batch(part[i : i + size], layers="average", pool="mean")
                passes.append(time.perf_counter() - start)
            out[f"batch{size}"] = {"tokens_per_s": tokens / min(passes), "sentences": len(part), "tokens": tokens}
        for size in sizes:
            if size != 1 and "batch1" in out:
                out[f"batch{size}_vs_batch1"] = out[f"batch{size}"]["tokens_per_s"] / out["batch1"]["tokens_per_s"]
        return out
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------- the server
def start_server(model_dir: Path, threads: int, *extra: str) -> tuple[subprocess.Popen, int]:
    """``elmokit serve`` on loopback, port 0; returns the process and its port once ``/health`` answers 200."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "elmokit", "serve", str(model_dir), "--host", HOST, "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--threads", str(threads), *extra], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    deadline = time.monotonic() + 120
    port = None
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"the server ended with {proc.returncode}")
        m = re.search(r"on http://127\.0\.0\.1:(\d+)/", line)
        port = int(m.group(1)) if m else None
    import threading

    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    while time.monotonic() < deadline:
        status, _ = asyncio.run(_one(port, "GET", "/health", b"", {}))
        if status == 200:
            return proc, port
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server never became healthy")


def stop_server(proc: subprocess.Popen) -> dict:
    """The server's peak RSS (VmHWM, MB; with ``--workers N`` the sum of its processes' peaks, an upper bound of
    the peak of their sum), then SIGTERM; its exit status."""
    peak = 0.0
    for member in _process_tree(proc.pid):
        try:
            with open(f"/proc/{member}/status") as fh:
                peak += sum(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmHWM:"))
        except OSError:
            continue
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = "killed"
    return {"peak_rss_mb": peak, "exit_status": code}


# ---------------------------------------------------------------------------------------------- the clients
async def _request(reader, writer, method: str, path: str, body: bytes, headers: dict) -> tuple[int, dict]:
    """One HTTP/1.1 request on a keep-alive connection: (status, response headers); the body is read and dropped."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    got = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode().partition(":")
        got[key.strip().lower()] = value.strip()
    await reader.readexactly(int(got.get("content-length", 0)))
    return status, got


async def _one(port: int, method: str, path: str, body: bytes, headers: dict) -> tuple[int, dict]:
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return 0, {}
    try:
        return await _request(reader, writer, method, path, body, headers)
    except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
        return 0, {}
    finally:
        writer.close()


async def _client(port, requests, counter, deadline, cap, timeout, record) -> None:
    """One client: requests in turn from the shared ``counter`` until ``deadline`` or ``cap`` requests."""
    conn = None
    while time.monotonic() < deadline and counter[0] < cap:
        i = counter[0]
        counter[0] += 1
        body, headers, tokens = requests[i % len(requests)]
        try:
            if conn is None:
                conn = await asyncio.open_connection(HOST, port)
            start = time.perf_counter()
            status, got = await asyncio.wait_for(_request(*conn, "POST", "/embed", body, headers), timeout)
            record.append((status, time.perf_counter() - start, tokens))
            if status == 429:
                await asyncio.sleep(float(got.get("retry-after", 1)))
        except asyncio.TimeoutError:
            record.append(("timeout", timeout, 0))
            conn = None
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
            record.append(("connection error", 0.0, 0))
            conn = None
            await asyncio.sleep(0.05)
    if conn is not None:
        conn[1].close()


def load(port: int, requests: list, clients: int, seconds: float, cap: int, timeout: float) -> dict:
    """``clients`` concurrent clients for ``seconds`` (at most ``cap`` requests): throughput and latency."""
    record: list = []

    async def main():
        deadline = time.monotonic() + seconds
        counter = [0]
        await asyncio.gather(
            *(_client(port, requests, counter, deadline, cap, timeout, record) for _ in range(clients))
        )

    start, cpu = time.perf_counter(), time.process_time()
    asyncio.run(main())
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    ok = [(lat, tok) for status, lat, tok in record if status == 200]
    lat = np.array([x for x, _ in ok]) * 1000 if ok else np.array([np.nan])
    statuses: dict[str, int] = {}
    for status, _, _ in record:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "clients": clients,
        "seconds": elapsed,
        "requests": len(record),
        "by_status": statuses,
        "tokens_per_s": sum(t for _, t in ok) / elapsed,
        "requests_per_s": len(ok) / elapsed,
        "latency_ms": {q: float(np.percentile(lat, int(q[1:]))) for q in ("p50", "p95", "p99")},
        "client_cpu_cores": cpu / elapsed,  # the load clients' own CPU (cores busy on average)
    }


def bodies(sentences: list[list[str]], mode: str, per_request: int = 1) -> list[tuple[bytes, dict, int]]:
    """One request per ``per_request`` consecutive sentences: (body, headers, tokens)."""
    options = {"pooled": {"layers": "average", "pool": "mean"}, "binary": {}, "json": {}}[mode]
    headers = {"Content-Type": "application/json"}
    if mode == "binary":
        headers["Accept"] = "application/x-npz"
    groups = [sentences[i : i + per_request] for i in range(0, len(sentences), per_request)]
    return [(json.dumps({"sentences": g, **options}).encode(), headers, sum(len(s) for s in g)) for g in groups]


# ---------------------------------------------------------------------------------------------- the run
def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``--workers N`` runs N worker processes under the server's), from /proc."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except OSError:  # the task ended meanwhile
                pass
    return found


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its descendants (all their threads) from /proc."""
    total = 0
    for member in _process_tree(pid):
        try:
            with open(f"/proc/{member}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def phase(model_dir, sentences, args, modes, clients, per_request, *extra) -> dict:
    loops = args.inference_loops or args.threads
    config = ("--recent-word-cache", str(args.recent_word_cache), "--inference-loops", str(loops))
    proc, port = start_server(model_dir, args.server_threads, *config, *extra)
    out: dict = {}
    try:
        for mode in modes:
            before = _cpu_seconds(proc.pid)
            out[mode] = load(
                port, bodies(sentences, mode, per_request), clients, args.seconds, args.max_requests, args.timeout
            )
            out[mode]["server_cpu_cores"] = (_cpu_seconds(proc.pid) - before) / out[mode]["seconds"]
    finally:
        out["server"] = stop_server(proc)
    return out


def ratios(server: dict, off: dict, modes: tuple[str, ...]) -> dict:
    """Each output's server tokens/s over offline's (pooled against pooled, the all-layer outputs against all
    layers): ``<mode>_vs_offline`` against the default ``Embedder``, ``<mode>_vs_offline_recent`` against one that
    keeps the recent words' vectors as the server does."""
    out = {}
    for mode in modes:
        base = "pooled" if mode == "pooled" else "all_layers"
        for suffix in ("", "_recent"):
            if base + suffix in off:
                out[f"{mode}_vs_offline{suffix}"] = server[mode]["tokens_per_s"] / off[base + suffix]["tokens_per_s"]
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60.0, help="per load phase")
    p.add_argument("--sentences", type=int, default=2000, help="the first N of EWT dev (it holds 2,001)")
    p.add_argument("--threads", type=int, default=2, help="torch threads, offline and in the server")
    p.add_argument(
        "--server-threads",
        type=int,
        default=1,
        help="the server's torch threads per inference loop (default: 1; a pass over a small batch keeps one core "
        "busy whatever the count)",
    )
    p.add_argument(
        "--inference-loops",
        type=int,
        default=None,
        help="the server's --inference-loops (default: --threads, so that server and offline use as many cores)",
    )
    p.add_argument("--max-requests", type=int, default=1_000_000, help="per phase, whatever the time")
    p.add_argument(
        "--sentences-per-request",
        default="1",
        help="consecutive EWT sentences in one request; a comma list (e.g. 1,8) runs the server phase once for each "
        "(the other phases use the first)",
    )
    p.add_argument(
        "--recent-word-cache",
        type=int,
        default=50_000,
        help="the server's --recent-word-cache (its default); offline is measured without and with it",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    p.add_argument(
        "--pass-sizes",
        default="1,12,32",
        help="batch sizes of the one-thread offline passes (``passes_one_thread``: what batching gains before HTTP; "
        "12 is about what 32 one-sentence clients give each of two loops); '' skips them",
    )
    p.add_argument("--overload-clients", type=int, default=512)
    p.add_argument("--overload-limit", type=int, default=64, help="the server's --max-concurrent-requests")
    p.add_argument(
        "--phases",
        default="server,batch1,overload",
        help="which load phases to run (comma-separated; the ratios need all three; a quick look: --phases server)",
    )
    p.add_argument("--modes", default="pooled,binary,json", help="the outputs of the server phase (comma-separated)")
    p.add_argument(
        "--server-args", default="", help="extra `elmokit serve` options of every phase, e.g. '--max-wait-ms 5'"
    )
    return p.parse_args()


def run_phases(args: argparse.Namespace, sentences: list[list[str]], per_request: list[int], modes: tuple) -> dict:
    """The offline passes, then the load phases asked for (``--phases``) on a fresh small model; each phase's figures
    are printed as one JSON line as soon as it ends. Returns them by name (``offline``, ``passes_one_thread``,
    ``server``/``server_k<K>``, ``batch1``/``batch1_k<K>``, ``overload``)."""
    phases, extra = set(args.phases.split(",")), args.server_args.split()
    k0 = per_request[0]
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(Path(tmp) / "small")
        result["offline"] = offline(model_dir, sentences, args.threads, args.recent_word_cache)
        print(json.dumps({"offline": result["offline"]}), flush=True)
        if args.pass_sizes:
            sizes = tuple(int(n) for n in args.pass_sizes.split(","))
            result["passes_one_thread"] = pass_sizes(model_dir, sentences, args.recent_word_cache, sizes)
            print(json.dumps({"passes_one_thread": result["passes_one_thread"]}), flush=True)
        if "server" in phases:
            for k in per_request:  # "server" for the first K, "server_k<K>" for the others
                key = "server" if k == k0 else f"server_k{k}"
                result[key] = phase(model_dir, sentences, args, modes, args.clients, k, *extra)
                print(json.dumps({key: result[key]}), flush=True)
        if "batch1" in phases:  # "batch1" for the first K, "batch1_k<K>" for the others
            one = ("--max-batch-sentences", "1")
            for k in per_request:
                key = "batch1" if k == k0 else f"batch1_k{k}"
                result[key] = phase(model_dir, sentences, args, ("pooled",), args.clients, k, *extra, *one)
                print(json.dumps({key: result[key]}), flush=True)
        if "overload" in phases:
            limit = ("--max-concurrent-requests", str(args.overload_limit))
            result["overload"] = phase(
                model_dir, sentences, args, ("pooled",), args.overload_clients, k0, *extra, *limit
            )
    return result


def add_ratios(result: dict, per_request: list[int], modes: tuple) -> None:
    """Add to ``result`` the server's ratios to offline (``ratios``/``ratios_k<K>``), dynamic batching's to one
    sentence a pass at the same request size (``dynamic_vs_batch1`` in them), and whether the overload phase was
    answered only 200 or 429."""
    k0, off = per_request[0], result["offline"]
    for k in per_request:  # "ratios" for the first K, "ratios_k<K>" for the others
        key = "server" if k == k0 else f"server_k{k}"
        if key in result:
            result["ratios" if k == k0 else f"ratios_k{k}"] = ratios(result[key], off, modes)
    for k in per_request:  # dynamic batching against one sentence a pass, at the same request size
        suffix = "" if k == k0 else f"_k{k}"
        server, batch1 = result.get("server" + suffix), result.get("batch1" + suffix)
        if server is not None and batch1 is not None and "pooled" in modes:
            result["ratios" + suffix]["dynamic_vs_batch1"] = (
                server["pooled"]["tokens_per_s"] / batch1["pooled"]["tokens_per_s"]
            )
    if "overload" in result:
        over = result["overload"]["pooled"]["by_status"]
        result["overload_only_200_and_429"] = set(over) <= {"200", "429"}


def main() -> None:
    args = parse_args()
    per_request = [int(k) for k in args.sentences_per_request.split(",")]
    modes = tuple(args.modes.split(","))
    sentences = read_conllu_forms(EWT_DEV, args.sentences)
    result: dict = {"sentences": len(sentences), "tokens": sum(len(s) for s in sentences), "args": vars(args)}
    result.update(run_phases(args, sentences, per_request, modes))
    add_ratios(result, per_request, modes)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
