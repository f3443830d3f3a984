"""``ggflow serve --ray``: the serving engine as Ray Serve replicas, one model per replica.

Two deployments. ``ggflow-model`` replicas each load the model into an ``Engine`` and run the very app
``ggflow serve`` runs (``create_app``), called in-process over ASGI: every OpenAI route, streaming included,
without a second copy of the routes. ``ggflow-ingress`` is Serve's FastAPI ingress: it reads the body,
hashes the prompt's prefixes (``ray_router.prefix_keys``) and forwards the request through a streaming handle;
the model deployment's request router (``ray_router.PrefixAffinityRouter``) reads those hashes and sends a
chat's next turn to the replica that holds its prefix in its KV cache. Each response says who served it in
the ``x-ggflow-replica`` header.

Serve does the rest: replicas (fixed or autoscaled on ongoing requests), health checks (``check_health``
raises when the engine thread has died), restarts.
"""

import asyncio
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ggflow.errors import GGFlowError
from ggflow.serving.ray_router import ROUTE_KWARG, prefix_keys
from ggflow.serving.responses import error_body

try:
    import ray
    from ray import serve
    from ray.serve.config import RequestRouterConfig
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise GGFlowError(f"ggflow serve --ray needs Ray Serve: pip install 'ggflow[ray]' ({exc})") from None

log = logging.getLogger(__name__)

REPLICA_HEADER = "x-ggflow-replica"
APP_NAME = "ggflow"
MODEL_DEPLOYMENT = "ggflow-model"
INGRESS_DEPLOYMENT = "ggflow-ingress"
ROUTER_CLASS = "ggflow.serving.ray_router.PrefixAffinityRouter"
HTTP_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]


@dataclass
class RayServeConfig:
    """What one deployment of a model needs; ``engine`` holds ``Engine.load``'s keyword arguments."""
    model_path: str
    model_name: str
    engine: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    num_replicas: int = 1
    max_replicas: int | None = None     # > num_replicas: autoscale between the two on ongoing requests
    num_cpus: float = 1.0               # Ray CPUs a model replica reserves
    router: str = "prefix"              # "prefix" (PrefixAffinityRouter) or "pow2" (Serve's default)
    health_check_period_s: float = 5.0

    @property
    def n_slots(self) -> int:
        return int(self.engine.get("n_slots", 4))

    def validate(self) -> None:
        if self.num_replicas < 1:
            raise GGFlowError(f"--replicas must be at least 1, got {self.num_replicas}")
        if self.max_replicas is not None and self.max_replicas < self.num_replicas:
            raise GGFlowError(f"--max-replicas ({self.max_replicas}) must be at least --replicas "
                              f"({self.num_replicas})")
        if self.router not in ("prefix", "pow2"):
            raise GGFlowError(f"unknown router {self.router!r}: use 'prefix' or 'pow2'")


def engine_thread_alive(engine: Any) -> bool:
    """Whether the engine's thread is running (Engine keeps no public flag; its thread is the truth)."""
    thread = getattr(engine, "_thread", None)
    return thread is not None and thread.is_alive()


# -- the model replica -------------------------------------------------------------------------------
class ModelServer:
    """One replica: one Engine, its own KV cache, the OpenAI app on it."""

    def __init__(self, config: RayServeConfig):
        from ggflow.process_heap import freeze_loaded_objects
        from ggflow.serving.app import ServerState, create_app
        from ggflow.serving.engine import Engine

        self.engine = Engine.load(config.model_path, **config.engine)
        freeze_loaded_objects()   # a replica's process is ggflow's (process_heap.py)
        self.engine.start()
        self.app = create_app(ServerState(model_name=config.model_name, api_key=config.api_key, engine=self.engine))
        self.replica = serve.get_replica_context().replica_id.unique_id

    def check_health(self) -> None:
        if not engine_thread_alive(self.engine):
            raise RuntimeError(f"replica {self.replica}: the engine thread has stopped")

    async def forward(self, method: str, path: str, query: str, headers: list[tuple[str, str]], body: bytes,
                      **routing: Any) -> AsyncIterator[dict[str, Any]]:
        """Run one HTTP request through the app; yield its ASGI messages (the start, then the body pieces).

        ``routing`` (the prefix hashes) is for the router only. If the caller goes away, Serve cancels this
        generator, which cancels the app's handler, which cancels the engine request.
        """
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
                 "root_path": "", "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
        sent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        gone = asyncio.Event()
        body_read = False

        async def receive() -> dict[str, Any]:
            nonlocal body_read
            if not body_read:
                body_read = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()       # the handler polls for a disconnect: there is none until we are cancelled
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REPLICA_HEADER.encode(), self.replica.encode())]}
            sent.put_nowait(message)

        task = asyncio.ensure_future(self.app(scope, receive, send))
        task.add_done_callback(lambda _: sent.put_nowait(None))
        try:
            while (message := await sent.get()) is not None:
                yield message
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    break
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        finally:
            gone.set()
            if not task.done():
                task.cancel()

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop(drain=False, timeout=5)


# -- the ingress -------------------------------------------------------------------------------------
ingress_app = FastAPI(title="ggflow (Ray Serve)", docs_url=None, redoc_url=None, openapi_url=None)


@serve.ingress(ingress_app)
class Ingress:
    """Serve's HTTP entry: hashes the prompt prefix for the router, forwards, streams the answer back."""

    def __init__(self, model: Any):
        self.model = model.options(stream=True)

    @ingress_app.api_route("/{path:path}", methods=HTTP_METHODS)
    async def proxy(self, path: str, http: HTTPRequest):
        body = await http.body()
        path = "/" + path   # below the application's route prefix: the path the model's app knows
        keys = prefix_keys(path, body)
        stream = self.model.forward.remote(http.method, path, http.url.query,
                                           list(http.headers.items()), body, **{ROUTE_KWARG: keys})

        async def pieces() -> AsyncIterator[bytes]:
            try:
                async for message in stream:
                    if message.get("body"):
                        yield message["body"]
            finally:
                stream.cancel()

        try:
            start = await stream.__anext__()
            headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", [])
                       if bytes(k).lower() != b"content-length"]
            if any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers):
                response: Response = StreamingResponse(pieces(), status_code=start["status"])
            else:
                # a whole answer is one Response: a StreamingResponse would also watch for a disconnect,
                # which Serve reports as an unretrieved TaskCancelledError once the request is over
                response = Response(b"".join([piece async for piece in pieces()]), status_code=start["status"])
        except (ray.exceptions.RayActorError, StopAsyncIteration) as exc:
            return JSONResponse(error_body(f"the replica failed before answering: {exc}", "unavailable_error", 503),
                                status_code=503)
        response.raw_headers = headers + response.raw_headers   # the replica's, then our content-length
        return response


# -- building and running ----------------------------------------------------------------------------
def build_app(config: RayServeConfig) -> Any:
    """The Serve application: the ingress bound to the model deployment."""
    config.validate()
    options: dict[str, Any] = dict(
        name=MODEL_DEPLOYMENT, ray_actor_options={"num_cpus": config.num_cpus},
        # Serve queues beyond this at the handle; the engine's own queue never refuses what Serve sends
        max_ongoing_requests=2 * config.n_slots, health_check_period_s=config.health_check_period_s,
        health_check_timeout_s=max(30.0, 3 * config.health_check_period_s))
    if config.max_replicas is not None and config.max_replicas > config.num_replicas:
        options["autoscaling_config"] = {"min_replicas": config.num_replicas, "max_replicas": config.max_replicas,
                                         "target_ongoing_requests": config.n_slots}
    else:
        options["num_replicas"] = config.num_replicas
    if config.router == "prefix":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=ROUTER_CLASS, request_router_kwargs={"busy_threshold": config.n_slots})
    engine = {**config.engine, "max_queue": max(int(config.engine.get("max_queue", 0)), 2 * config.n_slots)}
    model_config = RayServeConfig(**{**config.__dict__, "engine": engine})
    model = serve.deployment(ModelServer).options(**options).bind(model_config)
    ingress = serve.deployment(Ingress).options(name=INGRESS_DEPLOYMENT, ray_actor_options={"num_cpus": 0})
    return ingress.bind(model)


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address``, or start a local Ray: loopback only, no dashboard, no usage stats."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        # Ray swaps 127.0.0.1 for the machine's address, and its gRPC servers then listen on every
        # interface, unless clusters are off (its setting for laptops): a local Ray is a one-node cluster
        from ray._private import ray_constants
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"   # for the processes Ray starts
        ray_constants.ENABLE_RAY_CLUSTER = False                # for this one, which imported ray already
        ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 logging_level=logging.WARNING)


def start(config: RayServeConfig, *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
          num_cpus: int | None = None) -> str:
    """Start (or join) Ray, deploy the app, wait until every replica is up; the base URL."""
    url = start_serve(host=host, port=port, address=address, num_cpus=num_cpus)
    deploy(config)
    return url


def start_serve(*, host: str = "127.0.0.1", port: int = 8000, address: str | None = None,
                num_cpus: int | None = None) -> str:
    """Ray and Serve's HTTP proxy, no application yet; the base URL."""
    init_ray(address, num_cpus)
    serve.start(http_options={"host": host, "port": port})
    return f"http://{host}:{port}"


def deploy(config: RayServeConfig, name: str = APP_NAME, route_prefix: str = "/") -> None:
    """Deploy (or redeploy) one model as the Serve application ``name`` at ``route_prefix``; wait until up."""
    serve.run(build_app(config), name=name, route_prefix=route_prefix)


def stop() -> None:
    serve.shutdown()
    ray.shutdown()


def run_forever(config: RayServeConfig, *, host: str, port: int, address: str | None) -> int:
    """``ggflow serve --ray``: serve until SIGTERM / Ctrl-C, then shut Serve (and a local Ray) down."""
    import signal

    init_ray(address)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):   # after ray.init, which installs a SIGTERM handler of its own
        signal.signal(sig, lambda signum, frame: done.set())
    url = start(config, host=host, port=port, address=address)
    log.warning("serving %s on %s with %d replica(s) (%s router)", config.model_name, url, config.num_replicas,
                config.router)
    done.wait()
    stop()
    return 0


def run_cli(args: Any, model_path: str, backends: Any) -> int:
    """``ggflow serve --ray``'s flags (serve_cmd.py's namespace; ``backends`` as it parsed --backend) -> a
    running deployment."""
    threads = args.threads or 1   # replicas share a node's cores: each takes what it reserves from Ray
    engine = dict(n_ctx=args.ctx_size, n_slots=args.parallel, n_batch=args.batch_size, max_queue=args.max_queue,
                  backends=backends, n_threads=threads, n_ubatch=args.ubatch_size,
                  type_k=args.cache_type_k.upper(), type_v=args.cache_type_v.upper(),
                  context_shift=args.context_shift, n_keep=args.keep)
    config = RayServeConfig(model_path=os.path.abspath(model_path),
                            model_name=args.alias or os.path.basename(model_path), engine=engine,
                            api_key=args.api_key, num_replicas=args.replicas, max_replicas=args.max_replicas,
                            router=args.ray_router, num_cpus=float(threads))
    return run_forever(config, host=args.host, port=args.port, address=args.ray_address)
