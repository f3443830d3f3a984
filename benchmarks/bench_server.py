"""Serving throughput: aggregate generated tokens/s and time to first token with 1, 2, 4, 8 concurrent clients.

    python benchmarks/bench_server.py                       # ggflow serve on the default model
    LLAMA_SERVER=/path/to/llama-server python benchmarks/bench_server.py   # and llama-server, interleaved
    GGFLOW_BASELINE=/path/to/other/checkout python benchmarks/bench_server.py   # and another ggflow, interleaved

Each client streams greedy /v1/completions of ``--tokens`` tokens (ignore_eos, so every request is as long)
over distinct prompts. Every concurrency level is warmed up first (a new batch size builds new graphs).
Both servers get the same model, -np, -c and -t; they run side by side and are measured in turn, level by
level, in ``--rounds`` passes; the table gives the medians over the passes.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

# Every server gets the caller's environment: importing ggflow here (for the default model's path) sets its
# OpenMP wait default in os.environ, which a baseline checkout or llama-server (libgomp too) would inherit.
CALLER_ENV = dict(os.environ)

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Three primary colors are",
           "The history of the Roman empire", "In a distant galaxy", "The recipe for bread starts with",
           "Machine learning is"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, name: str, log_dir: str, env: dict[str, str] | None = None,
          cwd: str | None = None) -> subprocess.Popen:
    log = open(os.path.join(log_dir, f"{name}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    deadline = time.monotonic() + 600
    with httpx.Client(timeout=5) as h:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"{name} exited with {proc.returncode}; see {log.name}")
            try:
                if h.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{name} did not become healthy in 600 s")


def one_request(base: str, prompt: str, n_tokens: int) -> tuple[float, int, float]:
    """(time to first token, completion tokens, seconds) for one streamed greedy completion."""
    body = {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, n_chunks, n_usage = None, 0, None
    with httpx.Client(timeout=600) as h, h.stream("POST", f"{base}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and choices[0].get("text"):
                n_chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                n_usage = chunk["usage"]["completion_tokens"]
    return ttft or 0.0, n_usage if n_usage is not None else n_chunks, time.perf_counter() - t0


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (Linux /proc); nan where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def level(base: str, clients: int, n_tokens: int, pid: int | None = None) -> dict[str, float]:
    """One level; with the server's pid also its CPU time per generated token, which a busy machine
    inflates far less than the wall time (other processes take cores, not the server's CPU seconds)."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(clients)]
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda p: one_request(base, p, n_tokens), prompts))
    wall = time.perf_counter() - t0
    tokens = sum(n for _, n, _ in results)
    return {"clients": clients, "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "ttft_median_s": statistics.median(t for t, _, _ in results),
            "ttft_max_s": max(t for t, _, _ in results),
            "cpu_ms_per_token": 1e3 * (cpu_seconds(pid) - cpu0) / max(tokens, 1)}


def main() -> int:
    from ggflow.api import default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="passes over every level and server (medians reported)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = args.model or default_model_path()
    log_dir = os.environ.get("BENCH_LOG_DIR", "/tmp")
    servers: dict[str, tuple[str, subprocess.Popen]] = {}
    try:
        def ggflow_serve(name: str, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
            port = free_port()
            servers[name] = (f"http://127.0.0.1:{port}", start(
                [sys.executable, "-m", "ggflow.cli", "serve", "-m", os.path.abspath(model), "--port", str(port),
                 "-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads)], port, name, log_dir,
                env or CALLER_ENV, cwd))

        ggflow_serve("ggflow")
        if os.environ.get("GGFLOW_BASELINE"):   # the same server from another checkout (before/after a change)
            baseline = os.path.abspath(os.environ["GGFLOW_BASELINE"])
            # run from its folder: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH,
            # so a baseline started from this checkout would import this checkout's ggflow
            ggflow_serve("ggflow-baseline", {**CALLER_ENV, "PYTHONPATH": baseline}, cwd=baseline)
        if os.environ.get("LLAMA_SERVER"):
            port = free_port()
            servers["llama-server"] = (f"http://127.0.0.1:{port}", start(
                [os.environ["LLAMA_SERVER"], "-m", model, "--host", "127.0.0.1", "--port", str(port),
                 "-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads), "-tb", str(args.threads),
                 "--no-warmup"], port, "llama-server", log_dir, CALLER_ENV))
        levels = [int(c) for c in args.clients.split(",")]
        for clients in levels:                        # warm-up: graphs and kernels for each batch size
            for base, _ in servers.values():
                level(base, clients, 8)
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        load0 = os.getloadavg()[0]
        for round_ in range(args.rounds):             # rounds outermost, servers interleaved per level:
            for clients in levels:                    # a change in the machine's load hits every row alike
                for name, (base, proc) in servers.items():
                    r = level(base, clients, args.tokens, proc.pid)
                    runs.setdefault((name, clients), []).append(r)
                    print(f"round {round_ + 1} {name:13s} clients={clients}  {r['tokens_per_s']:7.1f} tok/s  "
                          f"ttft median {r['ttft_median_s'] * 1e3:7.0f} ms  max {r['ttft_max_s'] * 1e3:7.0f} ms  "
                          f"server CPU {r['cpu_ms_per_token']:5.2f} ms/token  "
                          f"({r['tokens']} tokens in {r['seconds']:.1f} s)", file=sys.stderr, flush=True)
        rows = [{"server": name, "clients": clients,
                 **{k: statistics.median(r[k] for r in rs)
                    for k in ("tokens_per_s", "ttft_median_s", "ttft_max_s", "cpu_ms_per_token")}}
                for (name, clients), rs in runs.items()]
        rows.sort(key=lambda r: (r["server"] != "ggflow", r["clients"]))
        print(f"load average: {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print(f"medians of {args.rounds} rounds\n")
            print("| server | clients | tokens/s | vs 1 client | TTFT median (ms) | TTFT max (ms) | server CPU ms/token |")
            print("|---|---|---|---|---|---|---|")
            for r in rows:
                one = next((x for x in rows if x["server"] == r["server"] and x["clients"] == 1), r)["tokens_per_s"]
                print(f"| {r['server']} | {r['clients']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / one:.2f}x "
                      f"| {r['ttft_median_s'] * 1e3:.0f} | {r['ttft_max_s'] * 1e3:.0f} | {r['cpu_ms_per_token']:.2f} |")
    finally:
        for _, proc in servers.values():
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
