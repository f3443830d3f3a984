"""The gap between a streaming bystander's tokens, on an idle server and while other clients send heavy
requests that need no slot (issue 45 item 1: 1 MiB /tokenize bodies in a loop).

    python benchmarks/bench_bystander_gap.py                       # starts ggflow serve (the default model)
    python benchmarks/bench_bystander_gap.py --url http://127.0.0.1:8080 --label llama-server

The bystander streams greedy completions of --tokens tokens back to back and records the time between its
chunks (the first chunk of each stream excluded: that is prompt time). Phase 1: alone, --seconds. Phase 2:
the same while --clients clients each loop POST /tokenize with a --mib body. It prints the gap's p50 / p99
/ max in both phases, streams completed, and p99(load) / p99(idle); the target is <= 3. Needs a quiet
machine: on a shared one the figures say little.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from soak_server import free_port, start_server, stop_server  # noqa: E402


def bystander(url: str, tokens: int, stop: threading.Event, gaps: list[float], streams: list[int]) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=300) as h:
        while not stop.is_set():
            last = None
            with h.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
            streams.append(1)


def heavy(url: str, mib: float, stop: threading.Event, sent: list[int]) -> None:
    payload = json.dumps({"content": "word salad " * int(mib * (1 << 20) / 11)}).encode()
    with httpx.Client(base_url=url, timeout=600) as h:
        while not stop.is_set():
            h.post("/tokenize", content=payload, headers={"Content-Type": "application/json"})
            sent.append(1)


def phase(url: str, seconds: float, tokens: int, clients: int, mib: float) -> dict:
    stop = threading.Event()
    gaps: list[float] = []
    streams: list[int] = []
    sent: list[int] = []
    threads = [threading.Thread(target=bystander, args=(url, tokens, stop, gaps, streams), daemon=True)]
    threads += [threading.Thread(target=heavy, args=(url, mib, stop, sent), daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(120)
    gaps.sort()
    pick = (lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))] * 1e3) if gaps else (lambda q: float("nan"))
    return {"streams": len(streams), "gaps": len(gaps), "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "max_ms": gaps[-1] * 1e3 if gaps else float("nan"), "heavy_requests": len(sent),
            "mean_ms": statistics.fmean(gaps) * 1e3 if gaps else float("nan")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running server (default: start ggflow serve)")
    p.add_argument("--label", default="ggflow")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--mib", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    proc = None
    url = args.url
    if url is None:
        port = free_port()
        log = os.path.join(tempfile.gettempdir(), "bench_bystander_gap.log")
        proc = start_server(port, 2, 2048, args.threads, log, ("--max-body-bytes", str(int((args.mib + 1) * 2**20))))
        url = f"http://127.0.0.1:{port}"
    try:
        idle = phase(url, args.seconds, args.tokens, 0, args.mib)
        load = phase(url, args.seconds, args.tokens, args.clients, args.mib)
    finally:
        if proc is not None:
            stop_server(proc)
    for name, r in (("idle", idle), (f"{args.clients} x {args.mib:g} MiB /tokenize", load)):
        print(f"{args.label} {name}: {r['streams']} streams, gap p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
              f"max {r['max_ms']:.1f} ms ({r['gaps']} gaps; {r['heavy_requests']} heavy requests answered)")
    ratio = load["p99_ms"] / idle["p99_ms"]
    print(f"p99 under load / idle: {ratio:.2f} (target <= 3)")
    return 0 if ratio <= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
