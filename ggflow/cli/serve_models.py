"""``ggflow serve --models-dir DIR | --models-config FILE | --sleep-idle-seconds N``: the server over a pool of
models (ggflow/serving/model_pool.py) instead of one engine loaded at start."""
from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from ggflow.cli.args import int_at_least
from ggflow.errors import GGFlowError


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("many models (llama-server's router mode; see docs/serving.md)")
    group.add_argument("--models-dir", default=None, metavar="DIR",
                       help="serve every GGUF of DIR, named by its file stem; a request's model picks one")
    group.add_argument("--models-config", default=None, metavar="FILE",
                       help="serve the models a JSON or TOML file names, each with its own options")
    group.add_argument("--models-max", type=int_at_least(1), default=4,
                       help="models loaded at once; the least recently used idle one is unloaded first (default 4)")
    group.add_argument("--sleep-idle-seconds", type=_positive_seconds, default=None, metavar="N",
                       help="unload a model no request has used for N seconds; the next request loads it again")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; accepted: seconds > 0") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is out of range; accepted: seconds > 0")
    return value


def wanted(args: argparse.Namespace) -> bool:
    return bool(args.models_dir or args.models_config or args.sleep_idle_seconds is not None)


def engine_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's engine options: every model's, below what a config file sets for it."""
    return dict(n_ctx=args.ctx_size, n_slots=args.parallel, n_batch=args.batch_size, max_queue=args.max_queue,
                backends=args.backend, n_threads=args.threads, n_ubatch=args.ubatch_size,
                type_k=args.cache_type_k.upper(), type_v=args.cache_type_v.upper(),
                context_shift=args.context_shift, n_keep=args.keep)


def build_pool(args: argparse.Namespace, single_path: str | None):
    from ggflow.serving.model_config import ModelSpec, specs_from_config, specs_from_dir
    from ggflow.serving.model_pool import ModelPool

    if args.ray:
        raise GGFlowError("--ray serves one model: leave out --models-dir, --models-config and --sleep-idle-seconds")
    if args.models_dir and args.models_config:
        raise GGFlowError("--models-dir and --models-config both name the models: give one")
    if args.models_dir or args.models_config:
        if args.model or args.hf_repo:
            raise GGFlowError("-m/-hf name one model; --models-dir/--models-config name the server's models: give one")
        specs = specs_from_dir(args.models_dir) if args.models_dir else specs_from_config(args.models_config)
        return ModelPool(specs, max_loaded=args.models_max, sleep_idle_s=args.sleep_idle_seconds,
                         defaults=engine_defaults(args))
    spec = ModelSpec(args.alias or os.path.basename(single_path), single_path, load_on_startup=True)
    return ModelPool([spec], max_loaded=1, sleep_idle_s=args.sleep_idle_seconds, defaults=engine_defaults(args),
                     single=True)


def run_pool(args: argparse.Namespace, pool: Any, limits: Any, connection_limits: Any) -> int:
    import asyncio
    import logging

    import uvicorn

    from ggflow.serving.app import create_app
    from ggflow.serving.http_protocol import uvicorn_config
    from ggflow.serving.model_router import RouterState, install_router
    from ggflow.serving.rerank import ServingModes

    state = RouterState(model_name=pool.names[0], api_key=args.api_key, limits=limits)
    app = create_app(state)
    app.state.ggflow_modes = ServingModes(embedding_only=args.embedding, reranking=args.reranking)
    install_router(app, state, pool)
    config = uvicorn_config(app, args.host, args.port, connection_limits, log_level="info",
                            timeout_graceful_shutdown=None)
    server = uvicorn.Server(config)

    def preload() -> None:
        for entry in pool.models.values():
            if entry.spec.load_on_startup:
                try:
                    asyncio.run(pool.load(entry.name))
                except GGFlowError as exc:
                    logging.getLogger("ggflow.serving").error("%s", exc)

    loader = threading.Thread(target=preload, name="ggflow-preload", daemon=True)
    loader.start()
    pool.start_sleeper()
    stopped = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped.append(signum))
    server.run()
    loader.join()
    pool.close()
    return 0
