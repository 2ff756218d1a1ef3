"""One data-parallel replica: an LLMEngine in a process of its own, driven by the server's
DataParallelEngine (data_parallel.py) over two one-way pipes.

Commands come in on one pipe (add, abort, embed, stop) and are run between steps; events go out
on the other: `accepted` per request, and a `step` message (deltas, the engine's stats, and the
prefix blocks evicted since the last report) per engine step that produced deltas, and at least
every HEARTBEAT_SECONDS whatever happens (idle, or steps without deltas), so the server can tell
a hung replica from an idle one. Evictions are reported at most once per HEARTBEAT_SECONDS; the
block manager logs them as it drops blocks, in the router's own hashes (block_manager.chain_hash),
so the router stops sending a prefix's requests here once the engine has dropped it, however soon
after it was cached. The replica ignores SIGINT and SIGTERM: the server stops it with a command,
and a closed command pipe (the server is gone) ends it too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from localchat.config import EngineConfig
from localchat.engine.engine_core import add_or_error, compiled, has_grammar
from localchat.engine.embedding_groups import EmbeddingGroups
from localchat.engine.llm_engine import EngineStats, LLMEngine
from localchat.engine.model_info import ModelInfo
from localchat.engine.outputs import RequestOutput
from localchat.engine.sequence import Request
from localchat.engine.text_codec import TextCodec
from localchat.errors import EngineDeadError, LocalchatError

logger = logging.getLogger("localchat.server")
HEARTBEAT_SECONDS = 1.0


@dataclass(frozen=True)
class ReplicaArgs:
    index: int
    config: EngineConfig
    cuda_devices: str | None  # CUDA_VISIBLE_DEVICES for this replica (None: leave it)
    log_level: int
    send_codec: bool  # replica 0 hands its tokenizer and chat template to the server


@dataclass(frozen=True)
class ReplicaReady:
    """What a replica reports once loaded."""

    pid: int
    model_info: ModelInfo
    codec: TextCodec | None
    max_num_seqs: int
    stats: EngineStats


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
    events.send(("started", os.getpid()))
    try:
        engine = LLMEngine(args.config)
    except BaseException as exc:
        if not isinstance(exc, LocalchatError):
            logger.error("loading failed:\n%s", traceback.format_exc())
        events.send(("error", _portable(exc)))
        sys.exit(1)
    codec = engine.codec.copy() if args.send_codec else None
    ready = ReplicaReady(
        os.getpid(), engine.model_info, codec, engine.scheduler.max_num_seqs, engine.stats()
    )
    events.send(("ready", ready))
    try:
        _serve(engine, commands, events)
    except (EOFError, OSError):  # the server is gone: nobody to report to
        pass
    except BaseException as exc:
        logger.error("engine step failed:\n%s", traceback.format_exc())
        with contextlib.suppress(OSError):
            events.send(("failed", f"{type(exc).__name__}: {exc}"))
        _close(engine)
        sys.exit(1)
    _close(engine)


def _close(engine: LLMEngine) -> None:
    close = getattr(engine.runner, "close", None)  # a tensor-parallel group's other ranks
    if close is not None:
        close()


def _serve(engine: LLMEngine, commands: Connection, events: Connection) -> None:
    last_sent = last_report = time.monotonic()
    evicted_log: list[int] = []
    engine.block_manager.evicted_hashes = evicted_log
    embeddings: EmbeddingGroups[int] = EmbeddingGroups()  # embed calls waiting, by their ids
    accepting: dict[str, Request] = {}  # added, accepted once their grammar compiles
    while True:
        if not engine.has_unfinished() and not commands.poll(HEARTBEAT_SECONDS):
            check = getattr(engine.runner, "check_health", None)  # tensor-parallel ranks
            if check is not None:
                check()
        while commands.poll():
            if not _handle(engine, commands.recv(), events, embeddings, accepting):
                return
        outputs = engine.step() if engine.has_unfinished() else []
        if accepting:
            outputs = _accept(engine, accepting, outputs, events)
        embedded = embeddings.collect(engine.take_embedded()) if embeddings else []
        now = time.monotonic()
        # a step's deltas, the stats that count finished embeddings, or at least one message a
        # second whatever happens (the heartbeat)
        if outputs or embedded or now - last_sent >= HEARTBEAT_SECONDS:
            evicted: list[int] = []
            if now - last_report >= HEARTBEAT_SECONDS:
                evicted, last_report = evicted_log[:], now
                evicted_log.clear()
            events.send(("step", outputs, engine.stats(), evicted))
            last_sent = now
        # after the stats: a /metrics scrape once the answer is out already counts its prompts
        for embed_id, vectors in embedded:
            events.send(("embedded", embed_id, vectors))


def _accept(
    engine: LLMEngine,
    accepting: dict[str, Request],
    outputs: list[RequestOutput],
    events: Connection,
) -> list[RequestOutput]:
    """Send `accepted` for the requests whose grammar has compiled (before the step's outputs);
    returns the outputs less the aborts of the requests whose grammar failed."""
    rejected = set()
    for request_id, request in list(accepting.items()):
        outcome = compiled(engine, request)
        if outcome is None:
            continue
        del accepting[request_id]
        error = outcome if isinstance(outcome, LocalchatError) else None
        if error is not None:
            rejected.add(request_id)
        events.send(("accepted", request_id, error))
    return [o for o in outputs if o.request_id not in rejected] if rejected else outputs


def _handle(
    engine: LLMEngine,
    message: tuple,
    events: Connection,
    embeddings: EmbeddingGroups[int],
    accepting: dict[str, Request],
) -> bool:
    """Run one command; False once asked to stop."""
    match message:
        case ("add", request_id, prompt, params):
            added = add_or_error(engine, request_id, prompt, params)
            if isinstance(added, Request) and has_grammar(added):
                accepting[request_id] = added  # `accepted` once its grammar compiles
            else:  # the server has the prompt's token ids: only an error goes back
                events.send(("accepted", request_id, None if isinstance(added, Request) else added))
        case ("abort", request_id):
            accepting.pop(request_id, None)
            output = engine.abort(request_id)
            if output is not None:
                events.send(("step", [output], engine.stats(), []))
        case ("embed", embed_id, prompts, pooling):
            # queued in the scheduler beside the running requests; sent once all are in
            ids = [f"embed-{embed_id}-{i}" for i in range(len(prompts))]
            error = embeddings.add(engine, embed_id, ids, prompts, pooling)
            if error is not None:
                events.send(("embedded", embed_id, error))
        case ("stop",):
            for request_id in list(engine.requests):
                engine.abort(request_id)
            return False
    return True
