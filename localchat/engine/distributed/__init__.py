"""Tensor parallelism over torch.distributed (gloo on the CPU, NCCL on CUDA).

`parallel_state` holds the process group and the collectives; `shard_plan`, `sharded_weights` and
`parallel_layers` cut a loaded model into one rank's shard (Megatron-style); `worker` is the loop of
ranks 1..N-1, `worker_pool` starts and watches them, and `tp_runner` is rank 0's ModelRunner, which
drives them (`rank_messages`: its commands; `step_transfer`: what it sends each forward pass).
`supervised` is the spawned child with its pipes that both a tensor-parallel rank and a
data-parallel replica run as.
"""
