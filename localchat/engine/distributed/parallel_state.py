"""This process's place in the tensor-parallel group, and the collectives the model runs.

Every collective has a timeout (the process group's), so a rank that hangs turns into an error
instead of a wait forever; a rank that dies closes its sockets, which gloo reports at once.

Besides the group the model's tensors go through (NCCL on CUDA, gloo on the CPU), every rank joins
a gloo control group on the CPU: the health pings go through it (each with a timeout of its own,
so a hung rank is found while idle too), and so, under torchrun, do rank 0's commands.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from localchat import envs

# a command rank 0 broadcasts under torchrun: its code and up to COMMAND_WIDTH - 1 integers
# (rank_messages.to_ints: a forward's BatchHeader is the longest, 8)
COMMAND_WIDTH = 9
_state: dict[str, object] = {}  # "control": the gloo control group; "from_env": joined by torchrun


def free_address() -> str:
    """host:port of a free local TCP port for the rendezvous (rank 0 hosts the store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def init_group(rank: int, world_size: int, address: str, device: torch.device) -> None:
    """Join the group: NCCL for CUDA tensors, gloo for CPU ones. Rank 0 hosts the rendezvous
    store at `address` (host:port), the others connect to it."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        store=rendezvous_store(rank, world_size, address),
        rank=rank,
        world_size=world_size,
        timeout=_collective_timeout(),
    )
    _join_control()


def rendezvous_store(rank: int, world_size: int, address: str) -> dist.TCPStore:
    """The store at `address`: rank 0 listens on that host alone (a TCPStore made from a host
    name, as `tcp://` makes it, listens on every interface, so any machine that reaches this one
    could write into the rendezvous); the other ranks connect to it."""
    host, port = address.rsplit(":", 1)
    host = host.strip("[]")
    timeout = _collective_timeout()
    if rank != 0:
        return dist.TCPStore(host, int(port), world_size, False, timeout)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
        listener.listen(socket.SOMAXCONN)
        fd = listener.detach()  # the store's from here on
    finally:
        listener.close()
    try:
        return dist.TCPStore(host, int(port), world_size, True, timeout, master_listen_fd=fd)
    except BaseException:
        os.close(fd)
        raise


def init_from_env(device: torch.device) -> None:
    """Join the group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method="env://",
        timeout=_collective_timeout(),
    )
    _state["from_env"] = True
    _join_control()


def _collective_timeout() -> timedelta:
    """LOCALCHAT_TP_TIMEOUT: the most any one collective (or the rendezvous) may take."""
    return timedelta(seconds=envs.TP_TIMEOUT.get())


def _join_control() -> None:
    # under torchrun an idle rank waits on it for rank 0's next command: LOCALCHAT_TP_LOAD_TIMEOUT
    # at least (rank 0 pings every second while idle)
    seconds = max(envs.TP_LOAD_TIMEOUT.get(), envs.TP_TIMEOUT.get())
    _state["control"] = dist.new_group(backend="gloo", timeout=timedelta(seconds=seconds))


def joined_from_env() -> bool:
    """Whether this process joined a group torchrun started (not one rank 0 spawned)."""
    return bool(_state.get("from_env")) and dist.is_initialized()


def control_group():
    return _state["control"]


def destroy_group() -> None:
    _state.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def ping(timeout: timedelta | None = None) -> None:
    """Rank 0: wait for every other rank's answer to a ping (sent to them just before); raise
    RuntimeError naming the first rank that did not answer within `timeout` (default:
    LOCALCHAT_TP_PING_TIMEOUT)."""
    timeout = timeout or timedelta(seconds=envs.TP_PING_TIMEOUT.get())
    group = control_group()
    answers = [torch.zeros(1) for _ in range(1, dist.get_world_size())]
    works = [dist.irecv(a, src=r, group=group) for r, a in enumerate(answers, 1)]
    for rank, work in enumerate(works, 1):
        assert work is not None  # None only for a rank outside the group
        try:
            work.wait(timeout=timeout)
        except RuntimeError:
            raise RuntimeError(
                f"rank {rank} did not answer a health ping within "
                f"{timeout.total_seconds():g} s (hung)"
            ) from None


def answer_ping() -> None:
    dist.send(torch.ones(1), dst=0, group=control_group())


def send_command(code: int, values: tuple[int, ...] = ()) -> None:
    """Rank 0, under torchrun: broadcast a command's code and integers over the control group."""
    message = torch.zeros(COMMAND_WIDTH, dtype=torch.int64)
    message[0] = code
    message[1 : 1 + len(values)] = torch.tensor(values, dtype=torch.int64)
    dist.broadcast(message, src=0, group=control_group())


def receive_command() -> tuple[int, list[int]]:
    """The other ranks' side of send_command."""
    message = torch.zeros(COMMAND_WIDTH, dtype=torch.int64)
    dist.broadcast(message, src=0, group=control_group())
    values = message.tolist()
    return values[0], values[1:]


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` across the ranks, in place; returns it."""
    dist.all_reduce(tensor)
    return tensor


def broadcast(tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's `tensor` into every rank's (in place); returns it."""
    dist.broadcast(tensor, src=0)
    return tensor


def gather_columns(local: torch.Tensor, shard: int, total: int) -> torch.Tensor:
    """Concatenate each rank's [rows, <=shard] columns on rank 0 (trimmed to `total` columns);
    other ranks get their own piece back."""
    padded = local
    if local.shape[1] != shard:
        padded = torch.nn.functional.pad(local, (0, shard - local.shape[1]))
    padded = padded.contiguous()
    if dist.get_rank() != 0:
        dist.gather(padded, None, dst=0)
        return local
    pieces = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
    dist.gather(padded, pieces, dst=0)
    return torch.cat(pieces, dim=1)[:, :total]
