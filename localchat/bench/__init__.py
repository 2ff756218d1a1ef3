"""`localchat bench`: offline and online throughput/latency, always side by side with a peer.

workloads.py   the named workloads (G1 G2 C1 C2 C3 of DESIGN.md) and random-token requests
records.py     per-request timings and the figures derived from them (mean/p50/p99, tok/s)
offline.py     our engine, driven step by step
peer_hf.py     Hugging Face transformers `generate` on the same requests
peer_llama_cpp.py  llama-cpp-python on the same GGUF
online.py      any OpenAI-compatible server over streaming /v1/completions
report.py      the rich table and the --json file
command.py     the Typer command
"""
