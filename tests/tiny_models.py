"""The sizes of the tiny random models tests build from a config (2 layers, 64 wide): the loaders'
architectures in tests/engine and the safetensors repo the model commands pull in tests/models."""

TINY_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
