"""Soak ``ggflow serve``: N concurrent clients for a while, with seeded cancels, disconnects, embeddings,
grammar-constrained requests and tool calls.

    python benchmarks/soak_server.py                         # 32 clients, 10 minutes, the default model
    python benchmarks/soak_server.py --clients 8 --minutes 1 --slots 4

The server runs as its own process on 127.0.0.1 (so its RSS is its own, read from /proc). Each client
repeats, until the time is up, one of (drawn from its own seeded RNG):

  complete    a streamed completion read to [DONE] (usage included); 200 and a finish_reason expected
  plain       the same, not streamed
  cancel      a long streamed completion closed after a few chunks
  disconnect  a raw socket that sends a streamed request and resets the connection (SO_LINGER 0) before
              or after the first bytes of the answer
  embed       /v1/embeddings of 1 to 4 inputs drawn from a fixed set
  grammar     a greedy completion constrained by a GBNF grammar
  tool        a greedy chat completion with a tool the model may call (tools, tool_choice "auto")

At the end it checks: no 5xx (nor any other failure of a request that was read to its end), every slot
free (/slots), requests_processing and requests_deferred back to 0, llamacpp:tokens_predicted_total grown
by at least the tokens the clients received (cancelled streams count the chunks they read), the
server's peak RSS after the warm-up within 2 % of its RSS when the warm-up ended, and no lost or corrupted
reply: after the clients stop, the greedy replies they got (completions, grammar and tool requests, up to
``--replays`` distinct ones) are asked again one at a time and must come back the same, and every embedding
equals the one the idle server gives for its input (within EMBED_ATOL). It prints a summary and exits 1
when a check fails. Everything is bounded: the clients stop at the deadline, every request has a timeout,
the server is killed if it does not stop.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

WORDS = ("the a of river king city machine story light music garden winter ocean number language robot "
         "history bread mountain friend letter forest engine market school window dream paper").split()
OPENINGS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "In a distant galaxy",
            "The recipe for bread starts with", "Machine learning is"]
KINDS = (("complete", 0.4), ("plain", 0.1), ("cancel", 0.12), ("disconnect", 0.1), ("embed", 0.1),
         ("grammar", 0.09), ("tool", 0.09))
EMBED_TEXTS = ["The capital of France is Paris.", "Bananas are yellow.", "def add(a, b): return a + b",
               " ".join(WORDS), "A long time ago in a galaxy far, far away"]
GRAMMAR = 'root ::= ("yes" | "no") ", because " [a-z ]+ "."'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
QUESTIONS = ["What is the weather in Paris?", "Is it raining in Tokyo?", "Tell me a joke.", "What is 2 + 2?"]
REPLAYS = 100
# an input's cells in the shared cache are wherever the other requests left room (alone: in order), and the
# attention sums over them in cell order, so float32 rounding differs (seen: 8e-5 on a unit vector)
EMBED_ATOL = 1e-3
REQUEST_TIMEOUT_S = 120
# idle connections are dropped before the server's keep-alive timeout (uvicorn's 5 s): with httpx's default
# expiry of 5 s too, a request sent on a connection the server is closing just then is reset
KEEPALIVE_EXPIRY_S = 1.0
RSS_TOLERANCE = 0.02


# -- the server ------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, slots: int, ctx: int, threads: int, log_path: str,
                 extra: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ggflow.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "-np", str(slots), "-c", str(ctx), "-t", str(threads), *extra]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "GGFLOW_API_KEY": ""})
    deadline = time.monotonic() + 300
    with httpx.Client(timeout=5) as h:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"ggflow serve exited with {proc.returncode}; see {log_path}")
            try:
                if h.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.25)
    stop_server(proc)
    raise RuntimeError(f"ggflow serve was not healthy in 300 s; see {log_path}")


def stop_server(proc: subprocess.Popen) -> int | None:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            return None
    return proc.returncode


class RssSampler(threading.Thread):
    """The server's resident set (VmRSS, bytes) every ``interval`` seconds, with the time it was read."""

    def __init__(self, pid: int, interval: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
                self.samples.append((time.monotonic(), kb * 1024))
            except (OSError, StopIteration):
                return   # the process is gone
            self.stopped.wait(self.interval)

    def at(self, t: float) -> int:
        """The last sample read at or before t."""
        before = [rss for ts, rss in self.samples if ts <= t]
        return before[-1] if before else self.samples[0][1]

    def peak_after(self, t: float) -> int:
        return max((rss for ts, rss in self.samples if ts > t), default=0)


# -- the clients -----------------------------------------------------------------------------------------
@dataclass
class Tally:
    """What the clients saw; shared by the client threads under ``lock``."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: Counter = field(default_factory=Counter)       # kind -> requests made
    statuses: Counter = field(default_factory=Counter)       # HTTP status -> count (requests read to the end)
    failures: list[str] = field(default_factory=list)        # anything wrong with a request read to its end
    tokens_received: int = 0                                 # completion tokens (chunks for cancelled streams)
    prompt_tokens: int = 0                                   # usage.prompt_tokens of completed requests
    ttft_s: list[float] = field(default_factory=list)
    greedy: list[tuple[str, str, str, int]] = field(default_factory=list)   # (path, body, reply, cut short?)
    vectors: list[tuple[str, list[float]]] = field(default_factory=list)    # (input, embedding)

    def keep_greedy(self, path: str, body: dict, reply: str, cut: bool) -> None:
        if body.get("temperature") == 0:
            with self.lock:
                # the keys in the order sent: a tool's JSON schema is rendered into the prompt as it comes
                self.greedy.append((path, json.dumps(body), reply, int(cut)))

    def add(self, kind: str, status: int | None = None, tokens: int = 0, prompt: int = 0,
            ttft: float | None = None, failure: str | None = None) -> None:
        with self.lock:
            self.requests[kind] += 1
            if status is not None:
                self.statuses[status] += 1
            self.tokens_received += tokens
            self.prompt_tokens += prompt
            if ttft is not None:
                self.ttft_s.append(ttft)
            if failure:
                self.failures.append(f"{kind}: {failure}")


def random_body(rng: random.Random, max_tokens: int, stream: bool) -> dict:
    prompt = rng.choice(OPENINGS) + " " + " ".join(rng.choices(WORDS, k=rng.randint(0, 40)))
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body.update(temperature=0.8, seed=rng.randrange(1 << 30))
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def stream_request(h: httpx.Client, tally: Tally, body: dict, cancel_after: int | None) -> None:
    kind = "complete" if cancel_after is None else "cancel"
    t0 = time.monotonic()
    chunks, usage, finish, ttft, done, text = 0, None, None, None, False, []
    with h.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            return tally.add(kind, r.status_code, failure=f"status {r.status_code}: {r.text[:200]}")
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                payload = json.loads(line[6:])
                if "error" in payload:
                    return tally.add(kind, 200, tokens=chunks, failure=f"error event: {payload['error']}")
                for choice in payload.get("choices") or []:
                    if choice.get("text"):
                        chunks += 1
                        text.append(choice["text"])
                        ttft = ttft if ttft is not None else time.monotonic() - t0
                    finish = choice.get("finish_reason") or finish
                usage = payload.get("usage") or usage
            if cancel_after is not None and chunks >= cancel_after:
                return tally.add(kind, tokens=chunks)   # leaving the block closes the connection mid-stream
    if cancel_after is not None:   # it ended before we cancelled it: a complete stream after all
        kind = "complete"
    failure = None if done and usage and finish in ("stop", "length") else \
        f"incomplete stream (done={done}, usage={usage}, finish={finish})"
    tokens = usage["completion_tokens"] if usage else chunks
    if failure is None:
        tally.keep_greedy("/v1/completions", body, "".join(text), finish == "length" and tokens < body["max_tokens"])
    tally.add(kind, 200, tokens=tokens, prompt=usage["prompt_tokens"] if usage else 0, ttft=ttft, failure=failure)


def plain_request(h: httpx.Client, tally: Tally, body: dict) -> None:
    r = h.post("/v1/completions", json=body)
    if r.status_code != 200:
        return tally.add("plain", r.status_code, failure=f"status {r.status_code}: {r.text[:200]}")
    answer = r.json()
    usage = answer["usage"]
    ok = answer["choices"][0]["finish_reason"] in ("stop", "length")
    if ok:
        tally.keep_greedy("/v1/completions", body, answer["choices"][0]["text"],
                          answer["choices"][0]["finish_reason"] == "length"
                          and usage["completion_tokens"] < body["max_tokens"])
    tally.add("plain", 200, tokens=usage["completion_tokens"], prompt=usage["prompt_tokens"],
              failure=None if ok else f"finish_reason {answer['choices'][0]['finish_reason']!r}")


def disconnect_request(port: int, tally: Tally, body: dict, read_bytes: int) -> None:
    """Send a request, maybe read a little of the answer, then reset the connection."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        got = b""
        while len(got) < read_bytes:
            data = sock.recv(read_bytes - len(got))
            if not data:
                break
            got += data
        if got[:12] != b"HTTP/1.1 200"[:len(got)]:
            return tally.add("disconnect", failure=f"answered {got[:40]!r}")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close = RST
    tally.add("disconnect")


def embed_request(h: httpx.Client, tally: Tally, rng: random.Random) -> None:
    inputs = rng.sample(EMBED_TEXTS, rng.randint(1, 4))
    r = h.post("/v1/embeddings", json={"input": inputs, "encoding_format": "float"})
    if r.status_code != 200:
        return tally.add("embed", r.status_code, failure=f"status {r.status_code}: {r.text[:200]}")
    data = r.json()["data"]
    with tally.lock:
        tally.vectors += [(text, d["embedding"]) for text, d in zip(inputs, data)]
    tally.add("embed", 200, failure=None if len(data) == len(inputs) else f"{len(data)} vectors for {len(inputs)}")


def grammar_request(h: httpx.Client, tally: Tally, rng: random.Random) -> None:
    body = {"prompt": rng.choice(QUESTIONS) + " Answer:", "max_tokens": rng.randint(8, 32), "temperature": 0,
            "grammar": GRAMMAR}
    r = h.post("/v1/completions", json=body)
    if r.status_code != 200:
        return tally.add("grammar", r.status_code, failure=f"status {r.status_code}: {r.text[:200]}")
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    text = choice["text"]
    ok = text.startswith(("yes, because ", "no, because ")) or choice["finish_reason"] == "length"
    tally.keep_greedy("/v1/completions", body, text, choice["finish_reason"] == "length"
                      and usage["completion_tokens"] < body["max_tokens"])
    tally.add("grammar", 200, tokens=usage["completion_tokens"], prompt=usage["prompt_tokens"],
              failure=None if ok else f"reply {text!r} does not follow the grammar")


def tool_request(h: httpx.Client, tally: Tally, rng: random.Random) -> None:
    body = {"messages": [{"role": "user", "content": rng.choice(QUESTIONS)}], "tools": TOOLS,
            "tool_choice": "auto", "max_tokens": rng.randint(16, 48), "temperature": 0}
    r = h.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        return tally.add("tool", r.status_code, failure=f"status {r.status_code}: {r.text[:200]}")
    answer = r.json()
    choice, usage = answer["choices"][0], answer["usage"]
    tally.keep_greedy("/v1/chat/completions", body, message_text(choice["message"]),
                      choice["finish_reason"] == "length" and usage["completion_tokens"] < body["max_tokens"])
    tally.add("tool", 200, tokens=usage["completion_tokens"], prompt=usage["prompt_tokens"],
              failure=None if choice["finish_reason"] in ("stop", "length", "tool_calls") else
              f"finish_reason {choice['finish_reason']!r}")


def message_text(message: dict) -> str:
    """A chat reply's content and tool calls (names and arguments: the call ids differ from run to run)."""
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]
    return json.dumps([message.get("content"), calls])


def client_loop(i: int, port: int, seed: int, deadline: float, tally: Tally) -> None:
    rng = random.Random(f"{seed}-{i}")
    kinds, weights = zip(*KINDS)
    limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=REQUEST_TIMEOUT_S, limits=limits) as h:
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            try:
                if kind == "complete":
                    stream_request(h, tally, random_body(rng, rng.randint(4, 48), True), None)
                elif kind == "plain":
                    plain_request(h, tally, random_body(rng, rng.randint(4, 24), False))
                elif kind == "cancel":
                    stream_request(h, tally, random_body(rng, rng.randint(64, 256), True), rng.randint(1, 8))
                elif kind == "disconnect":
                    disconnect_request(port, tally, random_body(rng, rng.randint(32, 256), True),
                                       rng.choice([0, 1, 200, 600]))
                elif kind == "embed":
                    embed_request(h, tally, rng)
                elif kind == "grammar":
                    grammar_request(h, tally, rng)
                else:
                    tool_request(h, tally, rng)
            except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
                tally.add(kind, failure=f"{type(exc).__name__}: {exc}")


# -- the soak --------------------------------------------------------------------------------------------
def metrics(h: httpx.Client) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    r = h.get("/metrics")
    r.raise_for_status()
    return {s.name: s.value for family in text_string_to_metric_families(r.text) for s in family.samples}


def wait_idle(h: httpx.Client, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        slots = h.get("/slots").json()
        if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
            return slots
        time.sleep(0.2)


def prime(h: httpx.Client) -> None:
    """One request of each kind before the clients start: the code each first runs (grammar compiles, the
    embeddings graph, the chat template) is in place before the RSS is measured."""
    rng, scratch = random.Random(0), Tally()
    h.timeout = httpx.Timeout(REQUEST_TIMEOUT_S)
    embed_request(h, scratch, rng)
    grammar_request(h, scratch, rng)
    tool_request(h, scratch, rng)
    plain_request(h, scratch, random_body(rng, 24, False))


def replay(h: httpx.Client, tally: Tally, limit: int) -> tuple[int, list[str]]:
    """Ask the greedy requests again, one at a time on the idle server; (replies compared, mismatches)."""
    seen: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for path, body, reply, cut in tally.greedy:
        seen.setdefault((path, body), []).append((reply, cut))
    bad, n = [], 0
    for (path, body), replies in list(seen.items())[:limit]:
        solo_body = {k: v for k, v in json.loads(body).items() if k not in ("stream", "stream_options")}
        r = h.post(path, json=solo_body, timeout=REQUEST_TIMEOUT_S)
        if r.status_code != 200:
            bad.append(f"replay of {body[:80]} answered {r.status_code}")
            continue
        choice = r.json()["choices"][0]
        solo = message_text(choice["message"]) if "message" in choice else choice["text"]
        for reply, cut in replies:
            n += 1
            if reply != solo and not (cut and solo.startswith(reply)):
                bad.append(f"{path} {body[:80]}: got {reply[:60]!r}, alone {solo[:60]!r}")
    for text in sorted({t for t, _ in tally.vectors}):
        r = h.post("/v1/embeddings", json={"input": text, "encoding_format": "float"})
        solo = r.json()["data"][0]["embedding"] if r.status_code == 200 else None
        for got in (v for t, v in tally.vectors if t == text):
            n += 1
            if solo is None or max(abs(a - b) for a, b in zip(got, solo)) > EMBED_ATOL:
                bad.append(f"embedding of {text[:40]!r} differs from its solo vector")
    return n, bad


@dataclass
class Report:
    clients: int
    seconds: float
    warmup_s: float
    tally: Tally
    before: dict[str, float]
    after: dict[str, float]
    slots: list[dict]
    rss_warm: int
    rss_peak: int
    rss_end: int
    server_alive: bool
    replayed: int = 0
    mismatches: list[str] = field(default_factory=list)
    rss_tolerance: float = RSS_TOLERANCE

    def delta(self, name: str) -> float:
        return self.after.get(name, 0.0) - self.before.get(name, 0.0)

    def problems(self) -> list[str]:
        t = self.tally
        out = [f"{n} requests answered {s}" for s, n in sorted(t.statuses.items()) if s >= 500]
        out += t.failures[:20] + ([f"... {len(t.failures) - 20} more failures"] if len(t.failures) > 20 else [])
        if not self.server_alive:
            out.append("the server process died")
        busy = [s["id"] for s in self.slots if s["is_processing"]]
        if busy:
            out.append(f"slots {busy} still processing at the end")
        for gauge in ("llamacpp:requests_processing", "llamacpp:requests_deferred"):
            if self.after.get(gauge, -1) != 0:
                out.append(f"{gauge} is {self.after.get(gauge)} at the end, not 0")
        if self.delta("llamacpp:tokens_predicted_total") < t.tokens_received:
            out.append(f"tokens_predicted_total grew by {self.delta('llamacpp:tokens_predicted_total'):.0f}, "
                       f"but the clients received {t.tokens_received} tokens")
        evaluated = self.delta("llamacpp:prompt_tokens_total") + self.delta("llamacpp:prompt_tokens_cached_total")
        if evaluated < t.prompt_tokens:
            out.append(f"prompt tokens grew by {evaluated:.0f}, but completed requests had {t.prompt_tokens}")
        if self.rss_peak > self.rss_warm * (1 + self.rss_tolerance):
            out.append(f"peak RSS {self.rss_peak / 2**20:.1f} MiB is more than {self.rss_tolerance:.0%} above "
                       f"{self.rss_warm / 2**20:.1f} MiB after the warm-up")
        out += self.mismatches[:20]
        missing = [k for k, _ in KINDS if t.requests[k] == 0 and k not in ("complete", "cancel", "plain")]
        if t.requests["complete"] + t.requests["cancel"] == 0 or missing:
            out.append(f"not every kind of client ran: {dict(t.requests)}")
        return out

    def summary(self) -> str:
        t = self.tally
        ttft = sorted(t.ttft_s)
        p = (lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))] if ttft else 0.0)
        lines = [
            f"soak: {self.clients} clients for {self.seconds:.0f} s (warm-up {self.warmup_s:.0f} s)",
            "requests: " + ", ".join(f"{k} {t.requests[k]}" for k, _ in KINDS) + f" (total {sum(t.requests.values())})",
            "statuses: " + ", ".join(f"{s}: {n}" for s, n in sorted(t.statuses.items())),
            f"tokens received {t.tokens_received} ({t.tokens_received / self.seconds:.1f}/s); "
            f"tokens_predicted_total +{self.delta('llamacpp:tokens_predicted_total'):.0f}; "
            f"prompt tokens +{self.delta('llamacpp:prompt_tokens_total'):.0f} evaluated, "
            f"+{self.delta('llamacpp:prompt_tokens_cached_total'):.0f} cached; "
            f"decode calls +{self.delta('llamacpp:n_decode_total'):.0f}",
            f"time to first token: median {statistics.median(ttft) if ttft else 0:.2f} s, p95 {p(0.95):.2f} s",
            f"end: slots busy {sum(s['is_processing'] for s in self.slots)}/{len(self.slots)}, "
            f"requests_processing {self.after.get('llamacpp:requests_processing')}, "
            f"requests_deferred {self.after.get('llamacpp:requests_deferred')}",
            f"greedy replies and embeddings compared with their solo runs: {self.replayed}, "
            f"{len(self.mismatches)} differ",
            f"RSS: {self.rss_warm / 2**20:.1f} MiB after warm-up, peak {self.rss_peak / 2**20:.1f} MiB "
            f"({100 * (self.rss_peak / self.rss_warm - 1):+.2f} %), end {self.rss_end / 2**20:.1f} MiB",
        ]
        problems = self.problems()
        lines.append("OK" if not problems else "PROBLEMS:\n  " + "\n  ".join(problems))
        return "\n".join(lines)


def soak(port: int, pid: int, clients: int, seconds: float, seed: int = 0, warmup_s: float | None = None,
         replays: int = REPLAYS) -> Report:
    """Run the clients against the server on ``port`` (process ``pid``) and gather the report."""
    warmup_s = min(seconds / 4, 60.0) if warmup_s is None else warmup_s
    sampler = RssSampler(pid)
    sampler.start()
    tally = Tally()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as h:
        prime(h)
        before = metrics(h)
        t0 = time.monotonic()
        deadline = t0 + seconds
        threads = [threading.Thread(target=client_loop, args=(i, port, seed, deadline, tally), daemon=True)
                   for i in range(clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(max(deadline - time.monotonic(), 0) + REQUEST_TIMEOUT_S + 5)
        slots = wait_idle(h)
        after = metrics(h)
        t_end = time.monotonic()
        replayed, mismatches = replay(h, tally, replays)
    sampler.stopped.set()
    sampler.join(5)
    alive = _alive(pid)
    warm_t = t0 + warmup_s
    rss_end = sampler.at(t_end)
    peak = max((rss for ts, rss in sampler.samples if warm_t < ts <= t_end), default=0)
    return Report(clients, seconds, warmup_s, tally, before, after, slots, sampler.at(warm_t), peak, rss_end, alive,
                  replayed, mismatches)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


def run(clients: int, seconds: float, slots: int, ctx: int, threads: int, seed: int = 0,
        warmup_s: float | None = None, log_path: str = "soak_server.log", replays: int = REPLAYS,
        rss_tolerance: float = RSS_TOLERANCE) -> Report:
    port = free_port()
    proc = start_server(port, slots, ctx, threads, log_path)
    try:
        report = soak(port, proc.pid, clients, seconds, seed, warmup_s, replays)
        report.rss_tolerance = rss_tolerance
        return report
    finally:
        stop_server(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=None, help="how long the clients run (default 600)")
    parser.add_argument("--minutes", type=float, default=None, help="the same in minutes")
    parser.add_argument("--replays", type=int, default=REPLAYS, help="distinct greedy requests asked again alone")
    parser.add_argument("--warmup", type=float, default=None, help="seconds (default: a quarter, at most 60)")
    parser.add_argument("--slots", type=int, default=8, help="the server's -np (default 8)")
    parser.add_argument("--ctx", type=int, default=4096, help="the server's -c (default 4096)")
    parser.add_argument("--threads", type=int, default=1, help="the server's -t (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", default="soak_server.log", help="the server's output (default soak_server.log)")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else 60 * args.minutes if args.minutes is not None else 600
    report = run(args.clients, seconds, args.slots, args.ctx, args.threads, args.seed, args.warmup, args.log,
                 args.replays)
    print(report.summary())
    return 1 if report.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
