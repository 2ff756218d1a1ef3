"""The engine core: the engine loop and its client, scheduler, KV blocks, sequences, outputs."""
