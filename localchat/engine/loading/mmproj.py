"""llama.cpp's image encoder of a model, shipped as a GGUF file of its own (an "mmproj" file,
general.architecture "clip"), run by our encoders (engine/modeling/vision/) beside a GGUF text
model.

Projector types (`clip.projector_type`): gemma3 (Gemma 3: the SigLIP tower, then the average pool,
the soft-embedding norm and the projection) and idefics3 (SmolVLM, SmolVLM2, Idefics3: the SigLIP
tower with Idefics3's bucketed positions, the pixel shuffle and the projection). The tower's sizes
are the `clip.vision.*` keys; the projector's are the grid it pools to (Gemma 3:
`clip.vision.projector.scale_factor`, 4 where absent, as llama.cpp) or shuffles by (Idefics3, 2
where absent). Its tensors are under llama.cpp's names (v.patch_embd, v.position_embd,
v.blk.N.attn_q ... ffn_down, v.post_ln; mm.input_projection and mm.soft_emb_norm for Gemma 3,
mm.model.fc for Idefics3) in Hugging Face's layouts (the shapes reversed, as GGUF stores dims), but
for Gemma 3's soft-embedding norm, which llama.cpp's converter stores as 1 + w. A file whose type,
sizes or tensors our encoders cannot run, or whose embeddings are not the text model's width, is
refused in one line naming the file and what is wrong.

The image processor the server's prompts need (server/vision_prompt.py loads it from a directory)
is made from the file's metadata, as llama.cpp preprocesses: Gemma 3's pictures scaled to one
image_size square, Idefics3's cut into image_size tiles after scaling the longest edge to
`clip.vision.preproc_image_size`, each normalized by `clip.vision.image_mean`/`image_std`. It is
written once, with the text model's tokenizer and the multimodal config, into a cache directory
(models/paths.mmproj_dir).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from localchat.engine.loading.gguf_checkpoint import float_tensors, open_gguf, tensor_entries
from localchat.engine.loading.model_cache import build_once
from localchat.engine.modeling.vision.base import ImageEncoder
from localchat.engine.modeling.vision.registry import encoder_class
from localchat.errors import InvalidModelFileError, UnsupportedModelError
from localchat.models.paths import mmproj_dir

PROJECTORS = ("gemma3", "idefics3")
# the tokens each projector's prompts are built of: Gemma 3's start, end and soft image token;
# Idefics3's image token, the tokens around a tile, the whole picture's and the tiles' places
_TOKENS = {
    "gemma3": ("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
    "idefics3": ("<image>", "<fake_token_around_image>", "<global-img>", "<row_1_col_1>"),
}
_DEFAULT_SCALE = {"gemma3": 4, "idefics3": 2}  # llama.cpp's where the file says none
# the encoders' parameter names under llama.cpp's (a tower's and a block's; the projectors')
_TOWER = {
    "v.patch_embd": "embeddings.patch_embedding",
    "v.position_embd": "embeddings.position_embedding",
    "v.post_ln": "post_layernorm",
}
_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
_PROJECTOR_NAMES = {
    "gemma3": {
        "mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
        "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight",
    },
    "idefics3": {"mm.model.fc.weight": "connector.modality_projection.proj.weight"},
}
_TOWER_PREFIX = {"gemma3": "vision_tower.", "idefics3": "vision_model."}
_SHIFTED = {"mm.soft_emb_norm.weight": 1.0}  # stored as w + 1 (Gemma 3's norm)


@dataclass(frozen=True)
class Mmproj:
    """An mmproj file's image encoder, as its metadata describes it."""

    path: Path
    projector: str
    image_size: int
    patch_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float
    projection_dim: int  # the text model's width it projects into
    scale: int  # Gemma 3's pooling (patches per token a side), Idefics3's pixel shuffle
    longest_edge: int  # Idefics3: a picture's longest edge before it is cut into tiles
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    tensors: tuple[dict, ...]  # gguf_checkpoint.tensor_entries

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def tokens_per_image(self) -> int:
        """Image tokens of one picture (Gemma 3) or one tile (Idefics3)."""
        return (self.image_size // self.patch_size // self.scale) ** 2

    def refuse(self, what: str, cls: type[Exception] = InvalidModelFileError) -> Exception:
        return cls(f"{self.name}: {what}")


def read_mmproj(path: Path) -> Mmproj:
    """The image encoder an mmproj file holds, its metadata checked (tensors: `load_encoder`)."""
    path = Path(path)
    header = open_gguf(path)

    def field(key: str, default=None):
        return header.metadata.get(key, default)

    arch = field("general.architecture")
    if arch != "clip":
        raise InvalidModelFileError(
            f"{path.name} is not an mmproj file (llama.cpp's image encoder of a model): its "
            f"general.architecture is {arch!r}, not 'clip'"
        )
    if field("clip.has_vision_encoder", True) is not True:
        raise UnsupportedModelError(f"{path.name}: it holds no image encoder (audio only?)")
    projector = field("clip.projector_type") or field("clip.vision.projector_type")
    if projector not in PROJECTORS:
        raise UnsupportedModelError(
            f"{path.name}: projector type {projector!r} is not supported; supported: "
            f"{', '.join(PROJECTORS)}"
        )
    if field("clip.use_silu") or not field("clip.use_gelu"):
        raise UnsupportedModelError(
            f"{path.name}: its tower's activation is not SigLIP's GELU (clip.use_gelu is not set)"
        )
    sizes = {
        key: field(f"clip.vision.{key}")
        for key in (
            "image_size",
            "patch_size",
            "embedding_length",
            "feed_forward_length",
            "block_count",
            "attention.head_count",
            "projection_dim",
        )
    }
    scale = field("clip.vision.projector.scale_factor", _DEFAULT_SCALE[projector])
    sizes["projector.scale_factor"] = scale
    image_size = sizes["image_size"]
    longest = field("clip.vision.preproc_image_size", 4 * image_size if image_size else None)
    sizes["preproc_image_size"] = longest
    for key, value in sizes.items():
        if type(value) is not int or value < 1:
            found = "missing" if value is None else repr(value)
            raise InvalidModelFileError(
                f"{path.name}: clip.vision.{key} must be a positive integer, is {found}"
            )
    mean, std = field("clip.vision.image_mean"), field("clip.vision.image_std")
    for key, values, least in (("image_mean", mean, -math.inf), ("image_std", std, 0.0)):
        if not (isinstance(values, list) and len(values) == 3 and _above(values, least)):
            what = "3 numbers" if key == "image_mean" else "3 positive numbers"
            raise InvalidModelFileError(f"{path.name}: clip.vision.{key} must be {what}")
    eps = field("clip.vision.attention.layer_norm_epsilon", 1e-6)
    if not _above([eps], 0.0):
        raise InvalidModelFileError(
            f"{path.name}: clip.vision.attention.layer_norm_epsilon must be a positive number"
        )
    mmproj = Mmproj(
        path,
        projector,
        image_size,
        sizes["patch_size"],
        sizes["embedding_length"],
        sizes["feed_forward_length"],
        sizes["block_count"],
        sizes["attention.head_count"],
        float(eps),
        sizes["projection_dim"],
        scale,
        longest,
        tuple(float(v) for v in mean),
        tuple(float(v) for v in std),
        tuple(tensor_entries(header)),
    )
    _check_sizes(mmproj)
    return mmproj


def _above(values: list, least: float) -> bool:
    """Whether each of `values` is a finite number above `least`."""
    return all(type(v) in (int, float) and math.isfinite(v) and v > least for v in values)


def _check_sizes(mm: Mmproj) -> None:
    side = mm.image_size // mm.patch_size
    if mm.image_size % mm.patch_size or side < mm.scale or side % mm.scale:
        raise mm.refuse(
            f"a {mm.image_size}-pixel image in {mm.patch_size}-pixel patches does not "
            f"{'pool' if mm.projector == 'gemma3' else 'pixel-shuffle'} by scale factor {mm.scale}",
            UnsupportedModelError,
        )
    if mm.num_layers > len(mm.tensors):  # the encoder is built block by block
        raise mm.refuse(
            f"clip.vision.block_count is {mm.num_layers}, more than its {len(mm.tensors)} tensors"
        )
    if mm.hidden_size % mm.num_heads:
        raise mm.refuse(
            f"clip.vision.embedding_length {mm.hidden_size} does not split into "
            f"{mm.num_heads} heads"
        )
    if mm.longest_edge < mm.image_size:
        raise mm.refuse(
            f"clip.vision.preproc_image_size {mm.longest_edge} is smaller than a tile "
            f"({mm.image_size})"
        )


def multimodal_config(mm: Mmproj, text_config, tokenizer, text_name: str):
    """The transformers config of the vision-language model the mmproj file and the text model
    make (Gemma3Config, Idefics3Config): what our encoders and the image processor are built from.
    Refused where the text model is not the one the file belongs to (another width, no image
    tokens in its tokenizer)."""
    import transformers

    width = text_config.hidden_size
    if mm.projection_dim != width:
        raise mm.refuse(
            f"its image embeddings are {mm.projection_dim} wide, but the text model "
            f"({text_name}) takes {width}; is it the mmproj of another model?"
        )
    vocab = tokenizer.get_vocab()
    ids = {}
    for token in _TOKENS[mm.projector]:
        if token not in vocab:
            raise mm.refuse(
                f"the text model's tokenizer ({text_name}) has no {token} token, which a "
                f"{mm.projector} projector's prompts are made of; is it the mmproj of another "
                "model?",
                UnsupportedModelError,
            )
        ids[token] = vocab[token]
    vision: dict[str, Any] = dict(
        hidden_size=mm.hidden_size,
        intermediate_size=mm.intermediate_size,
        num_hidden_layers=mm.num_layers,
        num_attention_heads=mm.num_heads,
        image_size=mm.image_size,
        patch_size=mm.patch_size,
        layer_norm_eps=mm.layer_norm_eps,
        hidden_act="gelu_pytorch_tanh",
    )
    config: transformers.PretrainedConfig
    if mm.projector == "gemma3":
        boi, eoi, image = _TOKENS["gemma3"]
        config = transformers.Gemma3Config(
            text_config=text_config.to_dict(),
            vision_config=transformers.SiglipVisionConfig(**vision).to_dict(),
            mm_tokens_per_image=mm.tokens_per_image,
            boi_token_index=ids[boi],
            eoi_token_index=ids[eoi],
            image_token_index=ids[image],
        )
        config.architectures = ["Gemma3ForConditionalGeneration"]
    else:
        config = transformers.Idefics3Config(
            text_config=text_config.to_dict(),
            vision_config=transformers.Idefics3VisionConfig(**vision).to_dict(),
            scale_factor=mm.scale,
            image_token_id=ids["<image>"],
        )
        config.architectures = ["Idefics3ForConditionalGeneration"]
    return config


def tensor_names(mm: Mmproj) -> dict[str, str]:
    """llama.cpp's name -> the encoder's parameter name, for every tensor of the encoder."""
    tower = _TOWER_PREFIX[mm.projector]
    bases = {gguf: f"{tower}{ours}" for gguf, ours in _TOWER.items()}
    for i in range(mm.num_layers):
        for gguf, ours in _BLOCK.items():
            bases[f"v.blk.{i}.{gguf}"] = f"{tower}encoder.layers.{i}.{ours}"
    names = {
        f"{gguf}.{suffix}": f"{ours}.{suffix}"
        for gguf, ours in bases.items()
        for suffix in ("weight", "bias")
    }
    del names["v.position_embd.bias"]  # a table of rows, without a bias
    return {**names, **_PROJECTOR_NAMES[mm.projector]}


def load_encoder(mm: Mmproj, config, *, dtype: torch.dtype, device: torch.device) -> ImageEncoder:
    """The encoder `config` (multimodal_config) describes, with the file's weights, on `device`;
    a tensor missing, of another shape or not the encoder's refused by its llama.cpp name."""
    cls = encoder_class(config)
    assert cls is not None  # multimodal_config names an architecture with an encoder
    with torch.device("meta"):  # the shapes, before the sizes the metadata says are allocated
        expected = {name: tuple(t.shape) for name, t in cls(config).state_dict().items()}
    names = tensor_names(mm)
    found = {entry["name"]: entry for entry in mm.tensors}
    for gguf in found:
        if gguf not in names:
            raise mm.refuse(
                f"tensor {gguf} is not part of a {mm.projector} image encoder",
                UnsupportedModelError,
            )
    for gguf, ours in names.items():
        if gguf not in found:
            raise mm.refuse(f"tensor {gguf} is missing")
        shape = tuple(found[gguf]["shape"])
        if shape != expected[ours]:
            raise mm.refuse(
                f"tensor {gguf} has shape {list(shape)}, but its metadata and the text model "
                f"make it {list(expected[ours])}"
            )
    state = {}
    for gguf, tensor in float_tensors(mm.path, list(mm.tensors)):
        state[names[gguf]] = tensor - _SHIFTED.get(gguf, 0.0)
    encoder = cls(config)
    encoder.load_state_dict(state)
    return encoder.to(device, dtype).eval().requires_grad_(False)


def image_directory(mm: Mmproj, config, gguf_path: Path, tokenizer_dir: Path) -> Path:
    """The directory of the model's image processor (its preprocessor and processor configs, the
    tokenizer with the image tokens' roles) and the multimodal config, made on first use."""
    return build_once(
        mmproj_dir(gguf_path, mm.path), lambda out: _write_processor(mm, config, tokenizer_dir, out)
    )


def _write_processor(mm: Mmproj, config, tokenizer_dir: Path, out: Path) -> None:
    import transformers
    from transformers import AutoTokenizer

    normalize: dict[str, Any] = dict(image_mean=list(mm.image_mean), image_std=list(mm.image_std))
    processor: transformers.ProcessorMixin
    if mm.projector == "gemma3":
        boi, eoi, image = _TOKENS["gemma3"]
        roles = {"boi_token": boi, "eoi_token": eoi, "image_token": image}
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, extra_special_tokens=roles)
        processor = transformers.Gemma3Processor(
            image_processor=transformers.Gemma3ImageProcessorPil(
                size={"height": mm.image_size, "width": mm.image_size}, **normalize
            ),
            tokenizer=tokenizer,
            image_seq_length=mm.tokens_per_image,
        )
    else:
        processor = transformers.Idefics3Processor(
            image_processor=transformers.Idefics3ImageProcessorPil(
                size={"longest_edge": mm.longest_edge},
                max_image_size={"longest_edge": mm.image_size},
                **normalize,
            ),
            tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir),
            image_seq_len=mm.tokens_per_image,
        )
    processor.save_pretrained(out)
    config.save_pretrained(out)
