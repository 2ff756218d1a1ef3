"""Scheduler: token budget, chunked prefill, preemption of the newest sequence, sibling sharing."""

from localchat.engine.core.block_manager import BlockManager
from localchat.engine.core.scheduler import Scheduler
from localchat.engine.core.sequence import Request, SequenceStatus
from localchat.engine.sampling.sampling_params import SamplingParams

BS = 4


def add(scheduler, tokens, request_id, n=1):
    request = Request(request_id, list(tokens), SamplingParams(n=n))
    for seq in request.seqs:
        scheduler.add(seq)
    return request


def run_step(scheduler, batch, sampled=7):
    """What the engine does after the model ran: advance and append a token where one was
    sampled."""
    for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
        seq.num_computed_tokens += num_new
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(sampled)


def test_long_prompt_is_chunked_while_decodes_continue():
    scheduler = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=6)
    short = add(scheduler, range(3), "short").seqs[0]
    batch = scheduler.schedule()
    assert batch.num_new_tokens == [3]
    run_step(scheduler, batch)
    long = add(scheduler, range(100, 120), "long").seqs[0]
    chunks = []
    while long.num_computed_tokens < 20:
        batch = scheduler.schedule()
        assert batch.seqs[0] is short and batch.num_new_tokens[0] == 1  # the decode always advances
        assert batch.num_tokens <= 6
        chunks.append(batch.num_new_tokens[1])
        run_step(scheduler, batch)
    assert chunks == [5, 5, 5, 5]


def test_out_of_blocks_preempts_the_newest_and_recomputes_it_later():
    bm = BlockManager(4, BS)
    scheduler = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    old = add(scheduler, range(8), "old").seqs[0]
    new = add(scheduler, range(50, 58), "new").seqs[0]
    run_step(scheduler, scheduler.schedule())  # both prefilled: 2 blocks each, the pool is full
    assert old.num_tokens == 9 and new.num_tokens == 9
    batch = scheduler.schedule()  # old's 9th token needs a third block: new is preempted
    assert batch.num_preempted == 1 and batch.seqs == [old]
    assert (
        new.status is SequenceStatus.WAITING
        and new.block_table == []
        and new.num_computed_tokens == 0
    )
    assert scheduler.waiting[0] is new
    run_step(scheduler, batch)
    scheduler.finish(old)
    batch = scheduler.schedule()
    # new comes back: its first block survived in the prefix cache (old took the tail block), the
    # rest (prompt and the token it had sampled) is recomputed.
    assert batch.seqs == [new] and new.num_computed_tokens == 4 and batch.num_new_tokens == [5]
    assert scheduler.num_preemptions == 1 and new.num_preemptions == 1


def test_max_num_seqs_caps_the_running_set():
    scheduler = Scheduler(BlockManager(64, BS), max_num_seqs=2, max_num_batched_tokens=64)
    for i in range(3):
        add(scheduler, range(i * 10, i * 10 + 3), f"r{i}")
    batch = scheduler.schedule()
    assert len(batch.seqs) == 2 and len(scheduler.waiting) == 1


def test_samples_of_one_request_share_the_prompt_blocks():
    bm = BlockManager(64, BS)
    scheduler = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    first, second = add(scheduler, range(10), "r", n=2).seqs
    batch = scheduler.schedule()
    assert batch.seqs == [first, second]
    assert batch.num_new_tokens == [10, 2]  # the second computes only the tail of the prompt
    assert second.block_table[:2] == first.block_table[:2]


def test_sibling_waits_while_the_first_sample_is_still_chunking():
    scheduler = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=6)
    first, second = add(scheduler, range(12), "r", n=2).seqs
    for _ in range(2):  # the prompt takes two chunks of 6; the second sample waits meanwhile
        batch = scheduler.schedule()
        assert batch.seqs == [first]
        run_step(scheduler, batch)
    batch = scheduler.schedule()
    assert batch.seqs == [first, second] and batch.num_new_tokens == [1, 4]
    assert second.num_cached_tokens == 8 and second.block_table[:2] == first.block_table[:2]


def test_finish_frees_everything():
    bm = BlockManager(16, BS)
    scheduler = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    request = add(scheduler, range(9), "r", n=3)
    run_step(scheduler, scheduler.schedule())
    for seq in request.seqs:
        scheduler.finish(seq)
    assert bm.num_free_blocks == 16 and not scheduler.has_unfinished()
