"""`localchat bench`: offline and online throughput/latency, always side by side with a peer.

workloads.py   the named workloads (G1 G2 C1 C2 C3 C4 of DESIGN.md) and random-token requests
records.py     per-request timings and the figures derived from them (mean/p50/p99, tok/s)
offline.py     our engine, driven step by step
peer_hf.py     Hugging Face transformers `generate` on the same requests
peer_llama_cpp.py  llama-cpp-python on the same GGUF
big_model.py   C4: localchat and llama.cpp on a big GGUF, each loaded in its own process
               (isolated.py watches it, isolated_child.py runs it), taking turns for --rounds
               rounds: load time and peak RSS besides TTFT and decode tok/s, the ratio paired
gguf_shapes.py, random_gguf.py  random-weight GGUF files of any shape and quantization
               (benchmarks/make_gguf.py)
online.py      any OpenAI-compatible server over streaming /v1/completions
report.py      the rich table and the --json file
cli.py         the Typer command
"""
