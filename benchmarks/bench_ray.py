"""Ray Serve replicas on one machine: throughput with 1 vs 2 replicas, and a follow-up turn's time to first
token on the replica holding its prefix vs another one.

    python benchmarks/bench_ray.py [--cores 2] [--sessions 6] [--requests 8] [--max-tokens 32]

Bounded: a few deployments of the default model (n_ctx 1024), every request short; a local Ray on
127.0.0.1, shut down at the end. Prints one JSON object (the figures docs/scale-out.md quotes).
"""
import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from ggflow.api import default_model_path
from ggflow.serving import ray_serve

PORT = 18473
TIMEOUT_S = 300
# a long opening turn, so a cold prompt costs visibly more than a cached one (~300 tokens)
OPENING = ("Session {i}. Here are my notes for today, read them and wait for my question. " +
           "The garden needs water on Monday and Thursday; the tomatoes are planted along the east fence, "
           "the beans near the shed, and the herbs in pots by the kitchen door. " * 6)


def deploy(replicas: int, threads: int, slots: int, router: str, cores: int) -> str:
    config = ray_serve.RayServeConfig(model_path=default_model_path(), model_name="smollm2",
                                      engine=dict(n_ctx=1024, n_slots=slots, n_threads=threads),
                                      num_replicas=replicas, num_cpus=cores / replicas, router=router)
    url = ray_serve.start(config, port=PORT, num_cpus=cores)
    throughput(url, 2 * replicas * slots, 4)   # every replica compiles its batched kernels before we measure
    return url


def throughput(url: str, n_requests: int, max_tokens: int) -> dict:
    """n_requests at once, each generating max_tokens; completion tokens per second of wall time."""
    def one(i):
        r = httpx.post(url + "/v1/completions", timeout=TIMEOUT_S, json={
            "prompt": f"Write a short story about robot number {i}.", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True})
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"], r.headers["x-ggflow-replica"]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_requests) as pool:
        results = list(pool.map(one, range(n_requests)))
    wall = time.perf_counter() - t0
    tokens = sum(n for n, _ in results)
    return {"requests": n_requests, "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1), "replicas_used": len({r for _, r in results})}


def ttft(http: httpx.Client, url: str, messages: list) -> tuple[float, str, int]:
    """Seconds to the first content chunk of a streamed chat turn, the replica, the cached prompt tokens."""
    t0 = time.perf_counter()
    first, cached = None, 0
    with http.stream("POST", url + "/v1/chat/completions", json={
            "messages": messages, "max_tokens": 4, "temperature": 0, "stream": True}) as r:
        replica = r.headers["x-ggflow-replica"]
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if first is None and data["choices"] and data["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - t0
            cached = data.get("timings", {}).get("cached_n", cached)
    return (first if first is not None else time.perf_counter() - t0), replica, cached


def follow_ups(url: str, sessions: int, tag: str) -> list[dict]:
    rows = []
    with httpx.Client(timeout=TIMEOUT_S) as http:
        for i in range(sessions):
            history = [{"role": "user", "content": OPENING.format(i=f"{tag}-{i}")}]
            r = http.post(url + "/v1/chat/completions", json={"messages": history, "max_tokens": 8,
                                                              "temperature": 0})
            first = r.headers["x-ggflow-replica"]
            history += [r.json()["choices"][0]["message"], {"role": "user", "content": "What is planted by the shed?"}]
            seconds, second, cached = ttft(http, url, history)
            rows.append({"ttft_s": seconds, "same_replica": second == first, "cached_n": cached})
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for same in (True, False):
        sel = [r["ttft_s"] for r in rows if r["same_replica"] is same]
        if sel:
            out["own_replica" if same else "other_replica"] = {
                "n": len(sel), "ttft_median_s": round(statistics.median(sel), 3),
                "cached_n_median": statistics.median(r["cached_n"] for r in rows if r["same_replica"] is same)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    figures: dict = {"cores": args.cores}
    try:
        url = deploy(2, 1, 2, "prefix", args.cores)
        figures["follow_up_prefix_router"] = summary(follow_ups(url, args.sessions, "p"))
        figures["throughput_2_replicas"] = throughput(url, args.requests, args.max_tokens)
        url = deploy(2, 1, 2, "pow2", args.cores)
        figures["follow_up_pow2_router"] = summary(follow_ups(url, args.sessions, "r"))
        url = deploy(1, args.cores, 4, "prefix", args.cores)
        figures[f"throughput_1_replica_{args.cores}_threads"] = throughput(url, args.requests, args.max_tokens)
        url = deploy(1, 1, 4, "prefix", args.cores)
        figures["throughput_1_replica_1_thread"] = throughput(url, args.requests, args.max_tokens)
    finally:
        ray_serve.stop()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
