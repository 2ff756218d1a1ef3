"""One data-parallel replica: an EngineCore (engine_core.py) in a process of its own, driven by the
server's DataParallelEngine (data_parallel.py) over two one-way pipes (a PipeTransport).

Commands (engine_messages.py) come in on one pipe and are run between steps; lists of events go out
on the other: Started, then CoreReady (or LoadFailed), then the core's events: Accepted per request,
and a StepDone (deltas, the engine's stats, and the prefix blocks evicted since the last report)
per engine step that produced deltas, and at least every HEARTBEAT_SECONDS whatever happens (idle,
or steps without deltas), so the server can tell a hung replica from an idle one. Evictions are
reported at most once per HEARTBEAT_SECONDS; the block manager logs them as it drops blocks, in the
router's own hashes (block_manager.chain_hash), so the router stops sending a prefix's requests
here once the engine has dropped it, however soon after it was cached. The replica ignores SIGINT
and SIGTERM: the server stops it with a command, and a closed command pipe (the server is gone)
ends it too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from localchat.config import EngineConfig
from localchat.engine.core.engine_core import EngineCore
from localchat.engine.core.engine_messages import CoreFailed, CoreReady, LoadFailed, Started
from localchat.engine.core.engine_transport import PipeTransport
from localchat.engine.core.llm_engine import LLMEngine
from localchat.errors import EngineDeadError, LocalchatError

logger = logging.getLogger("localchat.server")
HEARTBEAT_SECONDS = 1.0


@dataclass(frozen=True)
class ReplicaArgs:
    """What a replica's process is started with."""

    index: int
    config: EngineConfig
    cuda_devices: str | None  # CUDA_VISIBLE_DEVICES for this replica (None: leave it)
    log_level: int
    send_codec: bool  # replica 0 hands its tokenizer and chat template to the server


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else an EngineDeadError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return EngineDeadError(f"{type(exc).__name__}: {exc}")
    return exc


def run_replica(args: ReplicaArgs, commands: Connection, events: Connection) -> None:
    """The entry point of a spawned replica: load, report `ready` (or the load's error), serve."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if args.cuda_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = args.cuda_devices
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s %(levelname)s %(name)s[replica {args.index}]: %(message)s",
    )
    events.send([Started(os.getpid())])
    try:
        engine = LLMEngine(args.config)
    except BaseException as exc:
        if not isinstance(exc, LocalchatError):
            logger.error("loading failed:\n%s", traceback.format_exc())
        events.send([LoadFailed(_portable(exc))])
        sys.exit(1)
    codec = engine.codec.copy() if args.send_codec else None
    ready = CoreReady(
        os.getpid(), engine.model_info, codec, engine.scheduler.max_num_seqs, engine.stats()
    )
    events.send([ready])
    core = EngineCore(engine, heartbeat=HEARTBEAT_SECONDS, eviction_interval=HEARTBEAT_SECONDS)
    try:
        core.run(PipeTransport(commands, events))
    except (EOFError, OSError):  # the server is gone: nobody to report to
        pass
    except BaseException as exc:
        logger.error("engine step failed:\n%s", traceback.format_exc())
        with contextlib.suppress(OSError):
            events.send([CoreFailed(f"{type(exc).__name__}: {exc}")])
        core.close()
        sys.exit(1)
    core.close()
