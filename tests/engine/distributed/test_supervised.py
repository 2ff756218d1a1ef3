"""SupervisedProcess on small children: messages both ways, a child that exits or says nothing
before the awaited message (ProcessLost, told apart), and stopping one that will not exit."""

from __future__ import annotations

import sys
import time
from multiprocessing.connection import Connection

import pytest

from localchat.engine.distributed.supervised import ProcessLost, SupervisedProcess


def echo(greeting: str, commands: Connection, events: Connection) -> None:
    events.send(greeting)
    while (message := commands.recv()) is not None:
        events.send(message * 2)


def exit_with_3(commands: Connection, events: Connection) -> None:
    sys.exit(3)


def sleep_forever(commands: Connection, events: Connection) -> None:
    while True:
        time.sleep(1)


def test_messages_go_both_ways_and_the_child_exits_when_told():
    child = SupervisedProcess(echo, ("hello",), name="test-echo")
    try:
        assert child.wait_for(time.monotonic() + 60) == "hello"
        child.send(21)
        assert child.recv() == 42
        child.send(None)
        child.stop(timeout=30)
        assert child.exitcode == 0
    finally:
        child.kill()
        child.close_pipes()


def test_a_child_that_exits_first_is_lost_with_its_code():
    child = SupervisedProcess(exit_with_3, (), name="test-exit")
    try:
        with pytest.raises(ProcessLost, match="exited with code 3") as lost:
            child.wait_for(time.monotonic() + 60)
        assert lost.value.exited
    finally:
        child.close_pipes()


def test_a_child_that_says_nothing_in_time_is_lost_alive_and_can_be_killed():
    child = SupervisedProcess(sleep_forever, (), name="test-sleep")
    try:
        with pytest.raises(ProcessLost, match="sent nothing in time") as lost:
            child.wait_for(time.monotonic() + 0.5)
        assert not lost.value.exited and child.exitcode is None
        child.stop(timeout=0.2)  # it ignores the pipe: killed after the timeout
        assert child.exitcode is not None and child.exitcode < 0
    finally:
        child.kill()
        child.close_pipes()
