"""``ggflow serve``: an OpenAI-compatible HTTP server with N parallel slots (llama-server's -np)."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Any

from ggflow.cli.args import int_at_least, port_number
from ggflow.cli import serve_models
from ggflow.cli.common import add_hub_option, backend_names, hub_model_path
from ggflow.cli.lora_args import add_lora_arguments
from ggflow.cli.speculative_args import add_speculative_arguments, check_speculative_args, drafter_from_args
from ggflow.errors import GGFlowError
from ggflow.process_heap import freeze_loaded_objects
from ggflow.serving.limits import (DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_KEEP_ALIVE_S,
                                   DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADER_BYTES,
                                   DEFAULT_MAX_HEADERS, ConnectionLimits, ServerLimits)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                                   description="OpenAI-compatible server with continuous batching over N slots.")
    parser.add_argument("-m", "--model", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    add_hub_option(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8080, help="port (default 8080)")
    parser.add_argument("-np", "--parallel", type=int_at_least(1), default=4, help="slots: requests decoded together")
    parser.add_argument("-c", "--ctx-size", type=int_at_least(1), default=8192,
                        help="KV cache size in tokens, shared by the slots (default 8192)")
    parser.add_argument("-b", "--batch-size", type=int_at_least(1), default=512, help="tokens per step, at most (default 512)")
    parser.add_argument("-ub", "--ubatch-size", type=int_at_least(1), default=512, help="tokens per graph evaluation")
    parser.add_argument("-t", "--threads", type=int_at_least(1), default=None, help="CPU threads (default: all cores)")
    parser.add_argument("--backend", default="auto", help="backend name(s), comma separated (default: auto)")
    parser.add_argument("--cache-type-k", default="F16", help="KV cache type for K (F16, F32)")
    parser.add_argument("--cache-type-v", default="F16", help="KV cache type for V (F16, F32)")
    parser.add_argument("--max-queue", type=int_at_least(0), default=64,
                        help="requests that may wait for a slot; more are refused with 503 (default 64)")
    parser.add_argument("--context-shift", action="store_true",
                        help="a request that fills the context drops half of its older tokens and goes on "
                             "(llama-server's --context-shift; default: it ends with finish_reason length)")
    parser.add_argument("--slot-share", action="store_true",
                        help="each slot gets ctx-size/np cells of the cache, guaranteed: none is ended to make room "
                             "for another, longer prompts are refused (llama-server's split; default: one shared cache)")
    parser.add_argument("--keep", type=int_at_least(-1), default=0,
                        help="with --context-shift, prompt tokens kept at the front (-1: all; default 0)")
    parser.add_argument("--api-key", default=os.environ.get("GGFLOW_API_KEY"),
                        help="require 'Authorization: Bearer KEY' (default: $GGFLOW_API_KEY, else none)")
    limits = parser.add_argument_group("limits on one request")
    limits.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"larger request bodies get 413 (default {DEFAULT_MAX_BODY_BYTES})")
    limits.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_S,
                        help=f"seconds a client has to send its request body, else 408 (default "
                             f"{DEFAULT_BODY_TIMEOUT_S:g})")
    limits.add_argument("-n", "--max-tokens-cap", type=int, default=None,
                        help="a request asking for more tokens (or for no limit) gets this many, as "
                             "llama-server's -n (default: no cap)")
    parser.add_argument("--embedding", action="store_true",
                        help="serve /v1/embeddings only: generation routes answer 400 (llama-server's --embedding)")
    parser.add_argument("--reranking", action="store_true",
                        help="serve /v1/rerank (and /rerank); the model must be a reranker (llama-server's --reranking)")
    conns = parser.add_argument_group("limits on one connection")
    conns.add_argument("--max-header-bytes", type=int_at_least(1), default=DEFAULT_MAX_HEADER_BYTES,
                       help=f"a request line and headers larger than this get 431 (default {DEFAULT_MAX_HEADER_BYTES})")
    conns.add_argument("--max-headers", type=int_at_least(1), default=DEFAULT_MAX_HEADERS,
                       help=f"a request with more header fields gets 431 (default {DEFAULT_MAX_HEADERS})")
    conns.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_S,
                       help=f"seconds from a connection's start (or its last response) for a request's headers to "
                            f"arrive, else 408 and closed (default {DEFAULT_HEADER_TIMEOUT_S:g})")
    conns.add_argument("--keep-alive", type=float, default=DEFAULT_KEEP_ALIVE_S,
                       help=f"seconds an idle keep-alive connection stays open (default {DEFAULT_KEEP_ALIVE_S:g})")
    conns.add_argument("--max-connections", type=int_at_least(1), default=DEFAULT_MAX_CONNECTIONS,
                       help=f"open connections at once; more get 503 and are closed (default {DEFAULT_MAX_CONNECTIONS})")
    add_speculative_arguments(parser)
    parser.add_argument("--alias", default=None, help="model name the API reports (default: the file name)")
    serve_models.add_options(parser)
    add_lora_arguments(parser)
    parser.add_argument("--reasoning-format", default="auto", choices=["none", "auto", "deepseek", "deepseek-legacy"],
                        help="chat replies' <think>...</think> goes to reasoning_content (auto, deepseek) or stays in "
                             "the content (none); a request's reasoning_format overrides it (default auto)")
    parser.add_argument("--reasoning", default="auto", choices=["on", "off", "auto"],
                        help="thinking models: on renders with enable_thinking true, off with false and drops "
                             "reasoning (a request's reasoning_budget overrides it); auto: the template's default")
    parser.add_argument("--chat-template-file", default=None,
                        help="a Jinja chat template file to use instead of the model's tokenizer.chat_template")
    parser.add_argument("--slot-save-path", default=None,
                        help="folder for /slots/{id}?action=save|restore files (default: slot saving is off)")
    ray = parser.add_argument_group("Ray Serve (pip install 'ggflow[ray]'; see docs/scale-out.md)")
    ray.add_argument("--ray", action="store_true", help="serve as Ray Serve replicas with prefix-aware routing")
    ray.add_argument("--replicas", type=int, default=1, help="model replicas, each with -np slots (default 1)")
    ray.add_argument("--max-replicas", type=int, default=None,
                     help="autoscale between --replicas and this on ongoing requests")
    ray.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local Ray)")
    ray.add_argument("--ray-router", default="prefix", choices=["prefix", "pow2"],
                     help="prefix: a prompt goes to the replica caching its prefix (default); pow2: Serve's own")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn
        from ggflow.serving.app import ServerState, create_app
        from ggflow.serving.http_protocol import uvicorn_config
    except ImportError as exc:
        raise GGFlowError(f"ggflow serve needs the server extra: pip install 'ggflow[server]' ({exc})") from None
    from ggflow.api import default_model_path
    from ggflow.serving.engine import Engine
    from ggflow.serving.lora import load_adapters
    from ggflow.serving.rerank import ServingModes

    if args.parallel < 1:
        raise GGFlowError(f"-np must be at least 1, got {args.parallel}")
    limits = ServerLimits(max_body_bytes=args.max_body_bytes, body_timeout_s=args.body_timeout,
                          max_tokens_cap=args.max_tokens_cap)
    connection_limits = ConnectionLimits(max_header_bytes=args.max_header_bytes, max_headers=args.max_headers,
                                         header_timeout_s=args.header_timeout, keep_alive_s=args.keep_alive,
                                         max_connections=args.max_connections)
    if check_speculative_args(args) != "none" and serve_models.wanted(args):
        raise GGFlowError("speculation (--spec-type, -md) serves one model: leave it out with --models-dir, "
                          "--models-config or --sleep-idle-seconds")
    if args.lora_adapters and serve_models.wanted(args):
        raise GGFlowError("--lora serves one model: leave it out with --models-dir, --models-config or "
                          "--sleep-idle-seconds")
    if args.models_dir or args.models_config:
        return serve_models.run_pool(args, serve_models.build_pool(args, None), limits, connection_limits)
    path = hub_model_path(args) if args.hf_repo else args.model or default_model_path()
    if not os.path.isfile(path):
        raise GGFlowError(f"model file not found: {path}")
    if args.ray and args.lora_adapters:
        raise GGFlowError("--lora is not supported with --ray yet")
    if serve_models.wanted(args):   # --sleep-idle-seconds on one model
        return serve_models.run_pool(args, serve_models.build_pool(args, path), limits, connection_limits)
    if args.ray:
        from ggflow.serving.ray_serve import run_cli
        return run_cli(args, path, backend_names(args.backend))
    state = ServerState(model_name=args.alias or os.path.basename(path), api_key=args.api_key, limits=limits,
                        reasoning_format=args.reasoning_format, slot_save_path=args.slot_save_path,
                        chat_template_file=args.chat_template_file, reasoning=args.reasoning)
    if args.chat_template_file is not None:
        from ggflow.serving.llama_routes import read_template_file
        read_template_file(args.chat_template_file)   # a missing or unreadable file stops the start

    def load() -> None:  # /health answers 503 until this is done
        try:
            engine = Engine.load(path, n_ctx=args.ctx_size, n_slots=args.parallel, n_batch=args.batch_size,
                                 max_queue=args.max_queue, backends=backend_names(args.backend),
                                 n_threads=args.threads, n_ubatch=args.ubatch_size,
                                 type_k=args.cache_type_k.upper(), type_v=args.cache_type_v.upper(),
                                 context_shift=args.context_shift, n_keep=args.keep, slot_share=args.slot_share)
            modes.check_model(engine.ctx.model)
            engine.drafter = drafter_from_args(args, engine.ctx, backend_names(args.backend))
            load_adapters(engine.ctx, args.lora_adapters)
            freeze_loaded_objects()
            engine.start()
            state.engine = engine
            logging.getLogger("ggflow.serving").warning("model loaded: %s, %d slots, n_ctx %d",
                                                        path, args.parallel, args.ctx_size)
        except GGFlowError as exc:
            state.load_error = f"the model failed to load: {exc}"
            logging.getLogger("ggflow.serving").error(state.load_error)
            server.should_exit = True

    modes = ServingModes(embedding_only=args.embedding, reranking=args.reranking)
    app = create_app(state)
    app.state.ggflow_modes = modes
    config = uvicorn_config(app, args.host, args.port, connection_limits, log_level="info",
                            timeout_graceful_shutdown=None)
    server = uvicorn.Server(config)
    loader = threading.Thread(target=load, name="ggflow-load", daemon=True)
    loader.start()
    # uvicorn handles SIGTERM/SIGINT (stop accepting, let open responses finish), then raises the signal
    # again for the handler that was there before it: ours, so the engine drains and the exit status is 0
    stopped = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped.append(signum))
    server.run()
    loader.join()
    if state.engine is not None:
        state.engine.stop(drain=True)  # whatever is still queued or running completes
    return 0 if state.load_error is None else 1
