"""What the tensor-parallel ranks expose to the network: rank 0's rendezvous store listens on the
address it is given alone, and under torchrun no rank unpickles what another sends (a rank that
sends a pickle is refused, and the pickle never runs), while every setting survives its JSON."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
import torch

from localchat.config import EngineConfig
from localchat.engine.distributed import parallel_state, rank_json
from localchat.engine.distributed.worker import WorkerArgs
from localchat.engine.loading.loader import ModelFiles
from localchat.models.source import ModelSource
from tests.engine.distributed.test_tensor_parallel import TINY_LLAMA

pytestmark = pytest.mark.timeout(120)

# a rank that does what the object collectives do, with a pickle that makes a directory when it
# is loaded: its all_gather_object (rank 1) or broadcast_object_list (rank 0) framing by hand
_HOSTILE = """
import datetime, os, pickle, sys
import torch, torch.distributed as dist

class Payload:
    def __reduce__(self):
        return (os.mkdir, (sys.argv[1],))

timeout = datetime.timedelta(seconds=30)
dist.init_process_group("gloo", init_method="env://", timeout=timeout)
control = dist.new_group(backend="gloo", timeout=timeout)
payload = torch.frombuffer(bytearray(pickle.dumps(Payload())), dtype=torch.uint8)
if dist.get_rank() == 0:  # sends its "settings"
    dist.broadcast(torch.tensor([payload.numel()]), src=0, group=control)
    dist.broadcast(payload, src=0, group=control)
else:  # takes rank 0's settings, then reports its "load result"
    size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src=0, group=control)
    dist.broadcast(torch.empty(int(size), dtype=torch.uint8), src=0, group=control)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
    dist.all_gather(sizes, torch.tensor([payload.numel()]), group=control)
    longest = int(max(sizes))
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: payload.numel()] = payload
    dist.all_gather([torch.empty(longest, dtype=torch.uint8) for _ in sizes], mine, group=control)
"""

# the real rank 0 of a torchrun group: sends its settings, gathers the ranks' load results
_RANK_0 = """
import torch
from localchat.config import EngineConfig
from localchat.engine.distributed import parallel_state
from localchat.engine.distributed.torchrun import TorchrunGroup
from localchat.engine.distributed.worker import WorkerArgs

parallel_state.init_from_env(torch.device("cpu"))
settings = WorkerArgs(1, 2, "", EngineConfig(), None, "cpu", torch.float32, torch.float32, 64, 1)
try:
    TorchrunGroup(settings)
except Exception as exc:
    print(f"refused: {exc}")
else:
    print("took the report")
"""

# the real rank 1: takes rank 0's settings, then would load its shard
_RANK_1 = """
import sys, torch
from localchat.config import EngineConfig
from localchat.engine.distributed import parallel_state
from localchat.engine.distributed.torchrun import run_worker

parallel_state.init_from_env(torch.device("cpu"))
sys.exit(run_worker(EngineConfig(model=sys.argv[2]), 1, 2, torch.device("cpu")))
"""


def _free_port() -> int:
    return int(parallel_state.free_address().rsplit(":", 1)[1])


def _pair(rank_0: str, rank_1: str, tmp_path: Path) -> tuple[str, str, Path]:
    """Run the two scripts as ranks 0 and 1 of a torchrun-style group on this machine; their
    outputs (stdout and stderr), and the directory the pickle would make."""
    marker = tmp_path / "the-pickle-ran"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    port = _free_port()
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "LOCALCHAT_TP_TIMEOUT": "30",
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), str(marker), str(model)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, script in enumerate((rank_0, rank_1))
    ]
    try:
        outputs = [p.communicate(timeout=90)[0] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    return outputs[0], outputs[1], marker


def test_rank_0_refuses_a_pickled_load_report_without_loading_it(tmp_path):
    rank_0, rank_1, marker = _pair(_RANK_0, _HOSTILE, tmp_path)
    assert not marker.exists(), "rank 0 unpickled what rank 1 sent"
    assert "refused: tensor-parallel group failed: rank 1 sent" in rank_0, (rank_0, rank_1)
    assert "not JSON" in rank_0


def test_a_rank_refuses_pickled_settings_from_rank_0_without_loading_them(tmp_path):
    rank_0, rank_1, marker = _pair(_HOSTILE, _RANK_1, tmp_path)
    assert not marker.exists(), "rank 1 unpickled what rank 0 sent"
    assert "rank 1 of 2: refused rank 0's settings: rank 0 sent" in rank_1, (rank_0, rank_1)
    assert "Traceback" not in rank_1


def test_rank_0s_store_listens_on_the_address_it_is_given_alone():
    """A TCPStore made from `tcp://127.0.0.1:PORT` listens on every interface (`*:PORT`)."""
    address = parallel_state.free_address()
    port = int(address.rsplit(":", 1)[1])
    parallel_state.init_group(0, 1, address, torch.device("cpu"))
    try:
        listening = [
            (c.laddr.ip, c.laddr.port)
            for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]
        parallel_state.ping()  # the group works (no other rank to answer)
    finally:
        parallel_state.destroy_group()
    assert listening == [("127.0.0.1", port)]


def _settings() -> WorkerArgs:
    config = EngineConfig(
        model="m.gguf", kv_cache_memory="16MiB", max_num_seqs=8, gpu_memory_utilization=0.5
    )
    files = ModelFiles(Path("/models/m"), ModelSource("gguf", Path("/models/m.gguf"), "m"))
    return WorkerArgs(3, 4, "", config, files, "cuda", torch.bfloat16, torch.float16, 4096, 2)


def test_the_settings_survive_their_json_and_a_pickle_is_not_json():
    args = _settings()
    sent = rank_json.encode(args.to_json())
    got = rank_json.decode(sent.numpy().tobytes(), "rank 0")
    assert WorkerArgs.from_json(got, rank=3, files=args.files) == args
    with pytest.raises(ValueError, match=r"rank 0 sent \d+ bytes that are not JSON"):
        rank_json.decode(pickle.dumps(args.to_json()), "rank 0")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": "int8"}, "dtype is not one of"),
        ({"world_size": True}, "world_size is not a positive integer"),
        ({"device_type": "tpu"}, "device_type is not cpu or cuda"),
        ({"config": {"block_size": 7}}, "engine config does not hold"),
        ({"config": {"seed": [1]}}, "not a scalar"),
        ({"config": {"evil": 1}}, "not EngineConfig's"),
        ({"extra": 1}, "not the expected fields"),
    ],
)
def test_settings_of_the_wrong_shape_are_a_value_error(change, message):
    data = {**_settings().to_json(), **change}
    with pytest.raises(ValueError, match=message):
        WorkerArgs.from_json(data, rank=1, files=_settings().files)
