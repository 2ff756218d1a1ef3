"""What the engine may call on any model runner is declared on ModelRunner, not probed for: a
single-process runner's cross-process calls do nothing, a tensor-parallel one fills them in."""

from __future__ import annotations

from localchat.engine.distributed.tp_runner import TensorParallelRunner
from localchat.engine.modeling.model_runner import ModelRunner


def test_every_runner_has_the_cross_process_calls():
    runner = object.__new__(ModelRunner)  # the calls need nothing a built runner holds
    assert runner.check_health() is None
    assert runner.close() is None
    assert TensorParallelRunner.check_health is not ModelRunner.check_health
    assert TensorParallelRunner.close is not ModelRunner.close
