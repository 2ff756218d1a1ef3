"""The named benchmark workloads of DESIGN.md and the requests they generate.

Random-token prompts: one `random.Random(seed)` draws, per request, the prompt length, then the
output length, then the prompt's token ids (uniform over the vocabulary, special tokens excluded).
The same seed gives the same requests to every system measured.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from localchat.errors import InvalidParameterError

KINDS = ("throughput", "decode", "chat")
DECODE_SKIP = 16  # decode tok/s = (n - 16) / (time of token n - time of token 16), as G2 defines it


@dataclass(frozen=True, slots=True)
class Workload:
    """What to send. For kind 'chat', num_requests is the number of turns, input_len the user
    message length in tokens and output_len the reply length (both fixed)."""

    name: str
    title: str
    kind: str
    num_requests: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    model: str | None = None  # the model DESIGN.md names (used when MODEL is not given)
    load_format: str | None = None
    dtype: str | None = None
    # C4: the random-weight file (make_gguf preset, quantization) made when no FILE is given, and
    # each system run in a process of its own so that load time and peak RSS are that system's alone
    random_gguf: tuple[str, str] | None = None
    isolated: bool = False
    # isolated workloads: the systems take turns on `rounds` sets of requests (fresh ones each
    # round), so that each pair of runs meets the same state of the machine
    rounds: int = 1
    # C7: the report and the record carry the KV cache's bytes for the run's context (its dtype's,
    # float16's and q8_0's: kv_bytes.py)
    kv_bytes: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidParameterError(
                f"workload kind must be one of {KINDS}, got {self.kind!r}", param="workload"
            )
        if self.num_requests < 1:
            raise InvalidParameterError(
                f"--num-requests must be >= 1, got {self.num_requests}", param="num_requests"
            )
        if self.rounds < 1:
            raise InvalidParameterError(f"--rounds must be >= 1, got {self.rounds}", param="rounds")
        for name, (low, high) in (("input_len", self.input_len), ("output_len", self.output_len)):
            if not 1 <= low <= high:
                raise InvalidParameterError(
                    f"--{name.replace('_', '-')} must be MIN:MAX with 1 <= MIN <= MAX, "
                    f"got {low}:{high}",
                    param=name,
                )

    def describe(self) -> str:
        def span(r):
            return str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}"

        if self.kind == "chat":
            return (
                f"{self.name.upper()}: {self.title}: {self.num_requests} turns, "
                f"user messages ~{self.input_len[0]} tokens, replies {self.output_len[0]} tokens"
            )
        rounds = f", {self.rounds} paired rounds" if self.rounds > 1 else ""
        return (
            f"{self.name.upper()}: {self.title}: {self.num_requests} requests, "
            f"prompt {span(self.input_len)}, output {span(self.output_len)} tokens{rounds}"
        )


WORKLOADS: dict[str, Workload] = {
    "g1": Workload(
        "g1",
        "offline throughput, GPU",
        "throughput",
        256,
        (100, 1024),
        (100, 1024),
        model="../shared/models/qwen3-0.6b",
        load_format="dummy",
        dtype="bfloat16",
    ),
    "g2": Workload(
        "g2",
        "batch-1 decode, GPU",
        "decode",
        1,
        (128, 128),
        (256, 256),
        model="../shared/models/qwen3-0.6b",
        load_format="dummy",
        dtype="bfloat16",
    ),
    "c1": Workload("c1", "batch-1 decode, CPU", "decode", 1, (128, 128), (128, 128)),
    "c2": Workload("c2", "offline throughput, CPU", "throughput", 32, (32, 256), (32, 128)),
    "c3": Workload("c3", "multi-turn chat, CPU", "chat", 8, (150, 150), (64, 64)),
    "c4": Workload(
        "c4",
        "big model, CPU",
        "decode",
        1,
        (128, 128),
        (64, 64),
        random_gguf=("llama-8b", "q4_k_m"),
        isolated=True,
        rounds=4,
    ),
    "c5": Workload(
        "c5",
        "mixture of experts, CPU",
        "decode",
        1,
        (128, 128),
        (64, 64),
        random_gguf=("qwen3-30b-a3b", "q4_k_m"),
        isolated=True,
        rounds=4,
    ),
    # C4's machinery and file on an agent's long prompt: minutes of prefill a round, so 2 rounds
    "c7": Workload(
        "c7",
        "agent prompt, CPU",
        "decode",
        1,
        (8192, 8192),
        (256, 256),
        random_gguf=("llama-8b", "q4_k_m"),
        isolated=True,
        rounds=2,
        kv_bytes=True,
    ),
}


def parse_range(value: str | None, param: str) -> tuple[int, int] | None:
    """'32:256' -> (32, 256); '128' -> (128, 128); None stays None."""
    if value is None:
        return None
    parts = value.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2):
        raise InvalidParameterError(f"--{param} must be N or MIN:MAX, got {value!r}", param=param)
    return (numbers[0], numbers[-1])


def select_workload(
    name: str,
    num_requests: int | None = None,
    input_len: str | None = None,
    output_len: str | None = None,
    rounds: int | None = None,
) -> Workload:
    """A named workload with any of its sizes (and, for an isolated one, its rounds) overridden by
    the command's flags."""
    workload = WORKLOADS.get(name.lower())
    if workload is None:
        raise InvalidParameterError(
            f"--workload must be one of {', '.join(WORKLOADS)}, got {name!r}", param="workload"
        )
    changes: dict[str, Any] = {}
    if num_requests is not None:
        changes["num_requests"] = num_requests
    for field, value in (("input_len", input_len), ("output_len", output_len)):
        parsed = parse_range(value, field.replace("_", "-"))
        if parsed is not None:
            changes[field] = parsed
    if rounds is not None:
        if not workload.isolated:
            isolated = ", ".join(name for name, w in WORKLOADS.items() if w.isolated)
            raise InvalidParameterError(
                f"--rounds is for workloads that run each system in its own process "
                f"({isolated}), not {workload.name}",
                param="rounds",
            )
        changes["rounds"] = rounds
    if changes and workload.kind == "decode" and changes.get("num_requests", 1) != 1:
        raise InvalidParameterError(
            f"{workload.name} measures batch-1 decode: --num-requests must be 1",
            param="num_requests",
        )
    return replace(workload, **changes) if changes else workload


@dataclass(frozen=True, slots=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int
    prompt_text: str | None = None  # the ids decoded, for online mode's text endpoints


def allowed_token_ids(vocab_size: int, tokenizer=None) -> list[int]:
    """Ids a random prompt may use: the tokenizer's vocabulary (or the model's) minus special
    tokens."""
    size = min(vocab_size, len(tokenizer)) if tokenizer is not None else vocab_size
    special: set[int] = set()
    if tokenizer is not None:
        special.update(getattr(tokenizer, "all_special_ids", []) or [])
        decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
        special.update(i for i, token in decoder.items() if getattr(token, "special", False))
    return [i for i in range(size) if i not in special]


def random_requests(workload: Workload, token_ids: list[int], seed: int) -> list[BenchRequest]:
    """The workload's requests: per request prompt length, output length, then the prompt's
    tokens."""
    rng = random.Random(seed)
    requests = []
    for _ in range(workload.num_requests):
        prompt_len = rng.randint(*workload.input_len)
        output_len = rng.randint(*workload.output_len)
        requests.append(
            BenchRequest([rng.choice(token_ids) for _ in range(prompt_len)], output_len)
        )
    return requests


# a word list reads better as text than as a list literal
_WORDS = (  # noqa: SIM905
    "the a of to and in that it for on with as at by from this be was are have not or which one "
    "all would there their will when who more if out so up about into than them can only other new "
    "some time could these two may first then do any like my now over such our man me even most "
    "made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while last might "
    "us great old year off come since against go came right used take three small house garden "
    "river mountain city history engine memory paper music light water story question answer "
    "reason number system machine"
).split()


def user_messages(workload: Workload, tokenizer, seed: int) -> list[str]:
    """C3's user messages: random English words, each message grown to the target token count."""
    if tokenizer is None:
        raise InvalidParameterError(
            "the chat workload needs a model with a tokenizer", param="workload"
        )
    rng = random.Random(seed)
    target = workload.input_len[0]
    messages = []
    for _ in range(workload.num_requests):
        words: list[str] = []
        while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < target:
            words.extend(rng.choice(_WORDS) for _ in range(8))
        text = " ".join(words)
        ids = tokenizer.encode(text, add_special_tokens=False)[:target]
        messages.append(tokenizer.decode(ids).strip().capitalize() + "?")
    return messages
