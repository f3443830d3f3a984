"""The prefix cache shared across slots: 16 requests sharing a 1,500-token system prompt on -np 4, in waves of 4.

    python benchmarks/bench_prefix_cache.py                                   # ggflow serve, default model
    LLAMA_SERVER=/path/to/llama-server python benchmarks/bench_prefix_cache.py   # and llama-server, interleaved
    GGFLOW_BASELINE=/path/to/other/checkout python benchmarks/bench_prefix_cache.py   # and another ggflow

Each request is the system prompt (token ids, the same for every request) and a short question of its own,
sent as token ids so both servers see exactly the same tokens. A wave is 4 requests sent at once; the next
wave starts when the previous one is done. Reported per server, medians over ``--rounds`` passes (each pass
on freshly erased slots, so the first wave finds nothing cached):

- prompt tokens evaluated (the /metrics counter ``llamacpp:prompt_tokens_total``, before and after) against
  the ideal: one system prompt + the 16 suffixes (issue 41 asks for at most 1.1x);
- time to first token, p50 and p99 over the 16 requests (streamed, greedy, ``--tokens`` tokens each).

Figures need a quiet machine: TTFT is wall time and moves with the machine's load (docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_server import CALLER_ENV, free_port, start  # noqa: E402

SYSTEM_TEXT = ("You are the assistant of a small railway company. You answer questions about timetables, "
               "tickets, refunds, bicycles on trains, accessibility, lost property and delays. Be brief. ")
QUESTIONS = ["When is the first train?", "Can I bring a bicycle?", "How do I get a refund?",
             "Is there step-free access?", "Where is lost property?", "Are dogs allowed?",
             "Can I change my ticket?", "What if my train is late?", "Do children travel free?",
             "Is there wifi on board?", "Can I reserve a seat?", "How early should I arrive?",
             "Is there a quiet coach?", "Can I pay on the train?", "Where do I find the timetable?",
             "Are there discounts for students?"]


VERBOSE = False


def build_prompts(model: str, n_system: int, n_requests: int) -> tuple[list[int], list[list[int]]]:
    from ggflow.api.llm import LLM

    llm = LLM(model, vocab_only=True)
    system = llm.vocab.tokenize(SYSTEM_TEXT * (n_system // 10))
    while len(system) < n_system:
        system += llm.vocab.tokenize(SYSTEM_TEXT, add_special=False)
    system = system[:n_system]
    suffixes = [llm.vocab.tokenize(f"\nQ{i}: {QUESTIONS[i % len(QUESTIONS)]}\nA:", add_special=False)
                for i in range(n_requests)]
    return system, [system + s for s in suffixes]


def metric(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=60).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def one_request(base: str, prompt: list[int], n_tokens: int) -> dict[str, float]:
    body = {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, cached, evaluated = None, float("nan"), float("nan")
    with httpx.Client(timeout=1200) as h, h.stream("POST", f"{base}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any(c.get("text") for c in chunk.get("choices") or []):
                ttft = time.perf_counter() - t0
            usage = chunk.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
            if "timings" in chunk:
                cached = chunk["timings"].get("cache_n", chunk["timings"].get("cached_n", cached))
                evaluated = chunk["timings"].get("prompt_n", float("nan"))
    if VERBOSE:
        print(f"  request of {len(prompt)} tokens: TTFT {ttft:.2f} s, cached {cached}, evaluated {evaluated}",
              file=sys.stderr, flush=True)
    return {"ttft": ttft if ttft is not None else time.perf_counter() - t0, "cached": cached}


def erase(base: str, n_slots: int) -> None:
    for i in range(n_slots):
        httpx.post(f"{base}/slots/{i}", params={"action": "erase"}, timeout=60)


def one_pass(base: str, prompts: list[list[int]], wave: int, n_tokens: int, n_slots: int) -> dict[str, float]:
    erase(base, n_slots)
    before = metric(base, "llamacpp:prompt_tokens_total")
    results = []
    with ThreadPoolExecutor(wave) as pool:
        for w in range(0, len(prompts), wave):
            results += list(pool.map(lambda p: one_request(base, p, n_tokens), prompts[w: w + wave]))
    ttfts = sorted(r["ttft"] for r in results)
    return {"evaluated": metric(base, "llamacpp:prompt_tokens_total") - before,
            "ttft_p50_s": statistics.median(ttfts),
            "ttft_p99_s": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
            "cached": sum(r["cached"] for r in results)}


def main() -> int:
    from ggflow.api import default_model_path

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--wave", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8, help="generated tokens per request")
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-c", "--ctx-size", type=int, default=8192)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true", help="each request's TTFT and cached tokens")
    args = ap.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    model = args.model or default_model_path()
    system, prompts = build_prompts(model, args.system_tokens, args.requests)
    ideal = len(system) + sum(len(p) - len(system) for p in prompts)
    log_dir = os.environ.get("BENCH_LOG_DIR", "/tmp")
    servers: dict[str, tuple[str, subprocess.Popen]] = {}
    try:
        port = free_port()
        servers["ggflow"] = (f"http://127.0.0.1:{port}", start(
            [sys.executable, "-m", "ggflow.cli", "serve", "-m", model, "--port", str(port), "-np", str(args.parallel),
             "-c", str(args.ctx_size), "-t", str(args.threads)], port, "ggflow-prefix", log_dir, CALLER_ENV))
        if os.environ.get("GGFLOW_BASELINE"):   # the same server from another checkout (e.g. before the cache)
            port = free_port()
            baseline = os.path.abspath(os.environ["GGFLOW_BASELINE"])
            # run from the baseline's directory: `python -m` puts the working directory first on sys.path,
            # ahead of PYTHONPATH, so from this checkout it would import this checkout's ggflow
            servers["ggflow-baseline"] = (f"http://127.0.0.1:{port}", start(
                ["env", "-C", baseline, sys.executable, "-m", "ggflow.cli", "serve", "-m", model, "--port", str(port),
                 "-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads)], port,
                "ggflow-baseline-prefix", log_dir, {**CALLER_ENV, "PYTHONPATH": baseline}))
        if os.environ.get("LLAMA_SERVER"):
            port = free_port()
            servers["llama-server"] = (f"http://127.0.0.1:{port}", start(
                [os.environ["LLAMA_SERVER"], "-m", model, "--host", "127.0.0.1", "--port", str(port), "--metrics",
                 "--slots", "-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads),
                 "-tb", str(args.threads), "--no-warmup"], port, "llama-server-prefix", log_dir, CALLER_ENV))
        for base, _ in servers.values():             # warm-up: kernels and graphs, then forget the cache
            one_pass(base, prompts[: args.wave], args.wave, 2, args.parallel)
        runs: dict[str, list[dict[str, float]]] = {}
        load0 = os.getloadavg()[0]
        for round_ in range(args.rounds):
            for name, (base, _) in servers.items():  # interleaved: a change of load hits both alike
                r = one_pass(base, prompts, args.wave, args.tokens, args.parallel)
                runs.setdefault(name, []).append(r)
                print(f"round {round_ + 1} {name:13s} evaluated {r['evaluated']:.0f} ({r['evaluated'] / ideal:.2f}x "
                      f"ideal)  TTFT p50 {r['ttft_p50_s'] * 1e3:.0f} ms  p99 {r['ttft_p99_s'] * 1e3:.0f} ms",
                      file=sys.stderr, flush=True)
        rows = [{"server": name, "evaluated": statistics.median(r["evaluated"] for r in rs),
                 "ttft_p50_s": statistics.median(r["ttft_p50_s"] for r in rs),
                 "ttft_p99_s": statistics.median(r["ttft_p99_s"] for r in rs)} for name, rs in runs.items()]
        print(f"load average: {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end", file=sys.stderr)
        if args.json:
            print(json.dumps({"ideal": ideal, "system": len(system), "rows": rows}, indent=1))
        else:
            print(f"{args.requests} requests, a {len(system)}-token system prompt, -np {args.parallel}, waves of "
                  f"{args.wave}; ideal = one system prompt + the suffixes = {ideal} tokens; medians of {args.rounds}\n")
            print("| server | prompt tokens evaluated | vs ideal | TTFT p50 (ms) | TTFT p99 (ms) |")
            print("|---|---|---|---|---|")
            for r in rows:
                print(f"| {r['server']} | {r['evaluated']:.0f} | {r['evaluated'] / ideal:.2f}x | "
                      f"{r['ttft_p50_s'] * 1e3:.0f} | {r['ttft_p99_s'] * 1e3:.0f} |")
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
