"""Ray Serve replicas on one machine: throughput with 1 vs 2 replicas, and a follow-up turn's time to first
token on the replica holding its prefix vs another one.

    python benchmarks/bench_ray.py [--cores 2] [--rounds 3] [--sessions 2] [--requests 8] [--max-tokens 32]

Every configuration is deployed at once, as its own Serve application under its own route prefix, and the
rounds interleave them, so each sees the same background load (this machine is shared). Bounded: short
requests on the default model (n_ctx 1024), a local Ray on 127.0.0.1 shut down at the end. Prints one JSON
object: the medians over the rounds, and every round's figure.
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
# name: (replicas, threads per replica, slots per replica, router)
SETUPS = {"two_replicas": (2, 1, 2, "prefix"), "two_replicas_pow2": (2, 1, 2, "pow2"),
          "one_replica": (1, 1, 4, "prefix"), "one_replica_2_threads": (1, 2, 4, "prefix")}


def deploy_all(url: str, cores: int) -> None:
    n_replicas = sum(r for r, *_ in SETUPS.values())
    for name, (replicas, threads, slots, router) in SETUPS.items():
        config = ray_serve.RayServeConfig(model_path=default_model_path(), model_name="smollm2",
                                          engine=dict(n_ctx=1024, n_slots=slots, n_threads=threads),
                                          num_replicas=replicas, num_cpus=cores / n_replicas, router=router)
        ray_serve.deploy(config, name=name, route_prefix=f"/{name}")
        throughput(f"{url}/{name}", 2 * replicas * slots, 4)   # compile the batched kernels before measuring


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
    return {"tokens_per_s": round(sum(n for n, _ in results) / wall, 1), "replicas_used": len({r for _, r in results})}


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
    """Per session: a long first turn, then the follow-up's time to first token and where it went."""
    rows = []
    with httpx.Client(timeout=TIMEOUT_S) as http:
        for i in range(sessions):
            history = [{"role": "user", "content": OPENING.format(i=f"{tag}-{i}")}]
            r = http.post(url + "/v1/chat/completions", json={"messages": history, "max_tokens": 8,
                                                              "temperature": 0})
            first = r.headers["x-ggflow-replica"]
            history += [r.json()["choices"][0]["message"], {"role": "user", "content": "What is planted by the shed?"}]
            seconds, second, cached = ttft(http, url, history)
            rows.append({"ttft_s": round(seconds, 3), "same_replica": second == first, "cached_n": cached})
    return rows


def by_replica(rows: list[dict]) -> dict:
    out = {}
    for same in (True, False):
        sel = [r for r in rows if r["same_replica"] is same]
        if sel:
            out["own_replica" if same else "other_replica"] = {
                "n": len(sel), "ttft_median_s": round(statistics.median(r["ttft_s"] for r in sel), 3),
                "cached_n_median": statistics.median(r["cached_n"] for r in sel)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=2, help="chat sessions per router per round")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    tput: dict[str, list[float]] = {name: [] for name in SETUPS if name != "two_replicas_pow2"}
    turns: dict[str, list[dict]] = {"two_replicas": [], "two_replicas_pow2": []}
    try:
        url = ray_serve.start_serve(port=PORT, num_cpus=args.cores)
        deploy_all(url, args.cores)
        for rnd in range(args.rounds):
            for name in tput:
                tput[name].append(throughput(f"{url}/{name}", args.requests, args.max_tokens)["tokens_per_s"])
            for name in turns:
                turns[name] += follow_ups(f"{url}/{name}", args.sessions, f"{name}-{rnd}")
    finally:
        ray_serve.stop()
    figures = {"cores": args.cores, "rounds": args.rounds,
               "throughput_tokens_per_s": {n: {"median": statistics.median(v), "rounds": v} for n, v in tput.items()},
               "follow_up_ttft": {n: by_replica(rows) for n, rows in turns.items()}}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
