"""Grammar-constrained decoding with llguidance: compile grammars off the engine thread, and keep
one matcher per sequence that says which tokens may come next.

A request's grammar is an llguidance grammar string (`LLMatcher.grammar_from_json_schema`,
`grammar_from_regex`, `grammar_from_lark` make one). It compiles in a small thread pool, so one slow
schema never stalls the batch; the scheduler keeps the request waiting until it is ready. Each
sequence then gets its own copy of the compiled matcher, which advances on every accepted token.
"""

from __future__ import annotations

import copy
import logging
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import numpy as np
import torch

from localchat.engine.sampling.request_limits import limits
from localchat.errors import EngineDeadError, InvalidParameterError

logger = logging.getLogger("localchat.engine")

COMPILE_THREADS = 2
# how a compile's error message starts; the server swaps it for the request's field
GRAMMAR_ERROR_PREFIX = "invalid grammar: "


def grammar_error(detail: object) -> InvalidParameterError:
    """A grammar that does not compile for the model's tokenizer: the request's error, named
    `grammar` (the server renames it to the field that gave the grammar)."""
    return InvalidParameterError(f"{GRAMMAR_ERROR_PREFIX}{detail}", param="grammar")


def validate_grammar(grammar: str, param: str) -> None:
    """Raise an InvalidParameterError naming `param` when llguidance rejects `grammar` (no tokenizer
    needed; the cost of a compile, so call it off the event loop)."""
    try:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    except (ValueError, TypeError) as exc:
        raise InvalidParameterError(f"invalid {param}: {exc}", param=param) from exc
    if is_error:
        raise InvalidParameterError(f"invalid {param}: {messages[0]}", param=param)


class GrammarCompiler:
    """Builds llguidance matchers for one tokenizer in a thread pool.

    The llguidance tokenizer is made from the tokenizer's JSON, taken on the engine thread (a Rust
    tokenizer must not be read from two threads at once), the first time a grammar is compiled.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int]):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._tokenizer_json = ""
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._pending: dict[Future, float] = {}  # compiles running, and their deadlines
        self._pending_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._executor: llguidance.LLExecutor | None = None

    def compile(self, grammar: str) -> Future:
        """Start compiling (call on the engine thread); the future gives an LLMatcher or raises
        InvalidParameterError, also when the compile passes the grammar_seconds bound (checked
        by `expire`)."""
        if not self._tokenizer_json:
            backend = copy.copy(self._tokenizer.backend_tokenizer)
            backend.no_padding()
            backend.no_truncation()
            self._tokenizer_json = backend.to_str()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="localchat-grammar")
        future: Future = Future()
        future.set_running_or_notify_cancel()
        with self._pending_lock:
            self._pending[future] = time.monotonic() + limits().grammar_seconds
        self._pool.submit(self._settle, future, grammar)
        return future

    def _settle(self, future: Future, grammar: str) -> None:
        try:
            matcher = self._build(grammar)
        except BaseException as exc:  # the request's error, whatever the compile raised
            self._finish(future, exc)
            return
        self._finish(future, matcher)

    def _finish(self, future: Future, outcome: object) -> None:
        """Give `future` its matcher or exception, unless `expire` or `shutdown` ended it."""
        with self._pending_lock:
            if self._pending.pop(future, None) is None:
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def expire(self) -> None:
        """Fail the compiles that have run past their deadline (call on the engine thread, each
        step while any runs): their requests end with a 400; llguidance's fuel limits end the
        compile itself."""
        now = time.monotonic()
        with self._pending_lock:
            late = [future for future, deadline in self._pending.items() if deadline <= now]
            for future in late:
                del self._pending[future]
                future.set_exception(
                    InvalidParameterError(
                        f"the grammar did not compile within {limits().grammar_seconds:g} s "
                        "(the server's --limit grammar_seconds)",
                        param="grammar",
                    )
                )

    def _build(self, grammar: str) -> llguidance.LLMatcher:
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llguidance.LLTokenizer(
                    self._tokenizer_json, n_vocab=self._vocab_size, eos_token=self._eos
                )
            tokenizer = self._ll_tokenizer
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise grammar_error(matcher.get_error())
        return matcher

    def fill_bitmask(self, matchers: list, bitmask: torch.Tensor) -> None:
        """Write each matcher's allowed-token bitmask into its row of `bitmask` ([B, words] int32,
        CPU, contiguous), in parallel."""
        if self._executor is None:
            self._executor = llguidance.LLExecutor(num_threads=COMPILE_THREADS)
        words = bitmask.shape[1]
        self._executor.unsafe_compute_mask_ptr(
            [(m, row) for row, m in enumerate(matchers)],
            bitmask.data_ptr(),
            words * 4,
            bitmask.shape[0],
        )

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        with self._pending_lock:
            for future in self._pending:
                future.set_exception(EngineDeadError("the engine shut down"))
            self._pending.clear()


class GrammarState:
    """One sequence's matcher: which tokens may come next, and whether the grammar has ended."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: llguidance.LLMatcher):
        self.matcher = matcher

    def accept(self, token_id: int) -> bool:
        """Advance on a sampled token; True when the grammar allows nothing more (stop here)."""
        matcher = self.matcher
        if not matcher.consume_token(token_id):
            logger.warning("grammar rejected token %d: %s", token_id, matcher.get_error())
            return True
        return matcher.is_stopped()


def bitmask_to_bool(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, words] int32 CPU bitmask -> [B, vocab_size] bool, True where a token is allowed (bit k
    of word w is token 32w + k; numpy unpacks the little-endian bytes low bit first)."""
    data = bitmask.numpy()
    if sys.byteorder != "little":
        data = data.astype("<i4")
    bits = np.unpackbits(data.view(np.uint8), axis=1, bitorder="little")
    return torch.from_numpy(bits[:, :vocab_size].view(np.bool_))
