"""The forward passes: model families, decoder layers, MoE, rotary, CUDA graphs, the runner."""
