"""H3 Review Studio server: one FastAPI app with the REST API and the Gradio UI at "/".

    python app.py [--host H] [--port P] [--model PATH] [--data-dir DIR] [--auth FILE]
                  [--pod-rate USD_PER_HOUR] [--tiers-file FILE] [--queue-size N] [--max-job-seconds S]
                  [--max-jobs-per-user N]
                  [--remotes FILE] [--default-tier NAME] [--no-ui] [--ulysses N] [--sparse-backend NAME]

flags → store → service → REST routes + Gradio UI → serve; the engine's weights load in a background thread, so
/health answers 503 {"status": "loading"} as soon as the server listens and 200 once the model is ready.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kernels import sparse_backends  # names only: imports no torch
from studio.auth import Accounts, AuthFileError, load_accounts

if TYPE_CHECKING:  # the studio modules import torch: build_app imports them, so --help stays instant
    from fastapi import FastAPI

    from engine import Engine
    from studio.remote import RemoteSpec

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # the studio runs offline

log = logging.getLogger("h3studio")
GRACEFUL_SHUTDOWN_S = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="H3 Review Studio: generate, compare, review and export clips.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded h3-nano)")
    parser.add_argument("--data-dir", default="./data", help="database, clips, overlays and exports")
    parser.add_argument("--auth", default=None, help="JSON or user:password lines; protects REST and UI")
    parser.add_argument("--pod-rate", type=float, default=13.16, help="USD per hour, for $ per clip (13.16)")
    parser.add_argument("--tiers-file", default=None, help="TOML with extra [[tier]] tables")
    parser.add_argument("--queue-size", type=int, default=8, help="jobs that may wait behind the running one")
    # Defaults: studio/budget.py's DEFAULT_MAX_JOB_SECONDS and DEFAULT_MAX_JOBS_PER_USER (not imported: --help stays
    # instant).
    parser.add_argument("--max-job-seconds", type=float, default=3600.0,
                        help="refuse a request whose estimated engine time is longer (engine/cost.py; 3600)")
    parser.add_argument("--max-jobs-per-user", type=int, default=4,
                        help="jobs one user (or, without --auth, one client address) may have queued or running "
                             "(4; 0: no limit)")
    parser.add_argument("--no-ui", action="store_true", help="serve REST only (no Gradio)")
    parser.add_argument("--ulysses", type=int, default=1, help="engine processes/GPUs (1 = in-process)")
    parser.add_argument("--sparse-backend", default=None, choices=sparse_backends.choices(),
                        help=f"block-sparse attention backend of the engine (kernels/sparse_backends.py; "
                             f"default: ${sparse_backends.ENV} if set, else {sparse_backends.DEFAULT})")
    parser.add_argument("--remotes", default=None,
                        help="TOML with [[remote]] tables: SGLang-compatible /v1/videos servers, one tier each")
    parser.add_argument("--default-tier", default=None,
                        help="tier of a POST /v1/videos that names none (serve one configuration, like sglang serve)")
    args = parser.parse_args(argv)
    if args.queue_size < 1:
        parser.error("--queue-size must be >= 1")
    if not args.max_job_seconds > 0:
        parser.error("--max-job-seconds must be > 0")
    if args.max_jobs_per_user < 0:
        parser.error("--max-jobs-per-user must be >= 0 (0: no limit)")
    if args.pod_rate < 0:
        parser.error("--pod-rate must be >= 0")
    if args.ulysses < 1:
        parser.error("--ulysses must be >= 1")
    return args


def engine_loader(model: str | None, tiers_file: str | None, ulysses: int = 1,
                  sparse_backend: str | None = None) -> Callable[[], Engine]:
    """A callable that loads the engine (run on the service's loader thread); ulysses > 1: a worker group.
    `sparse_backend`: the engine's block-sparse backend choice (None: $H3_SPARSE_BACKEND if set, else auto)."""

    def load() -> Engine:
        if ulysses > 1:
            from engine import ParallelEngine

            # Engine's interface, N worker processes
            return ParallelEngine(model, tiers_file, world=ulysses, sparse_backend=sparse_backend)
        from engine import Engine

        return Engine.load(model_path=model, tiers_file=tiers_file, sparse_backend=sparse_backend)

    return load


def build_app(args: argparse.Namespace, accounts: Accounts | None = None,
              remotes: list[RemoteSpec] | None = None) -> FastAPI:
    """Everything the server runs, wired in the data-path order."""
    # Import the engine's module graph (torch, diffusers, transformers) on this thread before the loader thread
    # starts: two threads importing one package graph at once can see half-initialised modules.
    from engine import Engine  # noqa: F401
    from studio.api import create_app
    from studio.budget import DEFAULT_MAX_JOB_SECONDS, DEFAULT_MAX_JOBS_PER_USER
    from studio.remote import RemotePool
    from studio.service import StudioService

    pool = RemotePool(remotes) if remotes else None
    service = StudioService.open(Path(args.data_dir), pod_rate_usd_per_hour=args.pod_rate, queue_size=args.queue_size,
                                 max_job_seconds=getattr(args, "max_job_seconds", DEFAULT_MAX_JOB_SECONDS),
                                 max_jobs_per_user=getattr(args, "max_jobs_per_user", DEFAULT_MAX_JOBS_PER_USER)
                                 or None, remotes=pool, tiers_file=args.tiers_file)
    if pool is not None:
        pool.start()  # probes every server in the background; /health and the tier picker show the result
    loader = engine_loader(args.model, args.tiers_file, getattr(args, "ulysses", 1),
                           getattr(args, "sparse_backend", None))
    service.start_loading(loader)  # now, not at server startup: the weights load while Gradio builds the UI
    # every REST route: studio/routes/, installed in order by studio.routes.install_routes
    app = create_app(service, accounts=accounts, loader=loader, default_tier=getattr(args, "default_tier", None))
    if not args.no_ui:
        from studio.ui import build_ui
        from studio.ui.mount import mount_ui

        app = mount_ui(app, build_ui(service, accounts), accounts)
    return app


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from db.errors import DataDirError
    from studio.remote import RemotesFileError, load_remotes  # imports PyAV and httpx: not needed for --help

    try:
        accounts = load_accounts(args.auth) if args.auth else None
        remotes = load_remotes(args.remotes) if args.remotes else None
        app = build_app(args, accounts, remotes)
    except (AuthFileError, RemotesFileError, DataDirError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import uvicorn

    # Bounded shutdown: on SIGTERM, connections still open after this many seconds (held Gradio heartbeat and
    # queue streams never end by themselves; 500 of them kept the server up for 45 s and more, issue 42) are
    # cancelled and the service closes.
    uvicorn.run(app, host=args.host, port=args.port, log_level="info",
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
