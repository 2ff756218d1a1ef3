"""The tiny vision-language models of tests/vision_models.py (Gemma 3) and tests/idefics3_models.py
(SmolVLM, Idefics3) as llama.cpp ships them: the text model in a GGUF file (tests/gguf_writer.py,
with the VLM's own byte-level vocabulary, as llama.cpp's "gpt2" tokenizer model, and its chat
template) and the image encoder in an mmproj GGUF written as `convert_hf_to_gguf.py --mmproj`
writes it: general.architecture "clip", its `clip.*` metadata (the tower's sizes, the projector
type, the text model's width as the projection dim, the image processor's mean and std, Gemma 3's
pooling as the projector scale factor, Idefics3's pixel shuffle and longest edge), the tensors under
gguf-py's own names for them (TensorNameMap of MODEL_ARCH.MMPROJ, from the Hugging Face names the
converter reads), SigLIP's pooling head left out, Gemma 3's soft-embedding norm stored as 1 + w, and
the converter's types: F32 for 1-D tensors and the embeddings, F16 for the other matrices of an f16
file (Q8_0 blocks for those of a q8_0 file whose rows hold whole blocks).

The Gemma 3 model has llama.cpp's fixed layer pattern (tests/gguf_writer.GGUF_FAMILIES), the
SmolVLM and Idefics3 ones a Llama text model, which llama.cpp's converter writes as "llama".
`reference` is the transformers model with the vision weights the file rounds (f16, or Q8_0's
blocks read back).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import (
    MODEL_ARCH,
    GGMLQuantizationType,
    GGUFWriter,
    TokenType,
    get_tensor_name_map,
    quants,
)

from tests import gguf_writer, idefics3_models, vision_models

KINDS = ("gemma3", "smolvlm", "idefics3")
PROJECTOR = {"gemma3": "gemma3", "smolvlm": "idefics3", "idefics3": "idefics3"}
_TEXT = {  # kind -> (the text model's prefix in the VLM, gguf_writer family)
    "gemma3": ("model.language_model.", "gemma3"),
    "smolvlm": ("model.text_model.", "llama3"),
    "idefics3": ("model.text_model.", "llama3"),
}


def save(kind: str, directory: Path, **text_changes):
    """The VLM (float32, eval) with its safetensors checkpoint and processor saved in `directory`
    (the reference's files); returns (model, processor), the processor as the server loads it
    (server/vision_prompt.py). Gemma 3's text model has the layer pattern llama.cpp can store."""
    if kind != "gemma3":
        assert not text_changes
        return idefics3_models.save(kind, directory)
    changes = {**gguf_writer.GGUF_FAMILIES["gemma3"][1], **text_changes}
    return vision_models.save(directory, **changes)


def text_model(vlm, kind: str):
    """The VLM's text model as its own transformers causal LM (its weights shared)."""
    import transformers

    prefix, _ = _TEXT[kind]
    config = copy.deepcopy(vlm.config.text_config)
    config.tie_word_embeddings = False
    name = "Gemma3ForCausalLM" if kind == "gemma3" else "LlamaForCausalLM"
    model = getattr(transformers, name)(config)
    state = {
        ("model." + k.removeprefix(prefix)) if k.startswith(prefix) else k: v
        for k, v in vlm.state_dict().items()
        if k.startswith(prefix) or k == "lm_head.weight"
    }
    model.load_state_dict(state)
    return model.eval()


def write_text_gguf(vlm, kind: str, tokenizer, path: Path) -> Path:
    """The VLM's text model as an F32 GGUF file, with `tokenizer`'s special tokens (at their ids)
    and chat template: for SmolVLM and Idefics3 its byte-level vocabulary (llama.cpp's "gpt2"
    model), for Gemma 3 a sentencepiece one ("llama", as the real Gemma 3 files' vocabularies are)
    of byte tokens and the special tokens, whose text ids are not `tokenizer`'s."""
    model = text_model(vlm, kind)
    vocab = model.config.vocab_size

    def add_tokenizer(writer: GGUFWriter, arch: str) -> None:
        ids = range(len(tokenizer))
        special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
        if kind == "gemma3":  # the bytes first, where the byte-level symbols were
            assert not special & set(range(256))
            tokens = [f"<0x{b:02X}>" for b in range(256)]
            tokens += tokenizer.convert_ids_to_tokens(list(range(256, len(tokenizer))))
            types = [TokenType.BYTE] * 256 + [TokenType.CONTROL] * (len(tokens) - 256)
            tokens, types = [*tokens, "\u2581"], [*types, TokenType.NORMAL]
            writer.add_tokenizer_model("llama")
            writer.add_add_space_prefix(False)
        else:
            tokens = tokenizer.convert_ids_to_tokens(list(ids))
            types = [TokenType.CONTROL if i in special else TokenType.NORMAL for i in ids]
            writer.add_tokenizer_model("gpt2")
            writer.add_tokenizer_pre("default")
        # llama.cpp's converter fills the vocabulary up to the embedding's rows
        padding = [f"[PAD{i}]" for i in range(len(tokens), vocab)]
        writer.add_token_list(tokens + padding)
        writer.add_token_types([int(t) for t in types + [TokenType.UNUSED] * len(padding)])
        # the test tokenizers have no merges, which an empty list does not say to transformers'
        # reader: scores, from which it derives none
        writer.add_token_scores([0.0] * vocab)
        writer.add_bos_token_id(tokenizer.bos_token_id)
        writer.add_eos_token_id(tokenizer.eos_token_id)
        writer.add_pad_token_id(tokenizer.pad_token_id)
        writer.add_add_bos_token(False)
        writer.add_chat_template(tokenizer.chat_template)

    return gguf_writer.write_gguf(model, _TEXT[kind][1], path, tokenizer=add_tokenizer)


def _hf_name(name: str) -> str | None:
    """The name convert_hf_to_gguf.py reads for a VLM tensor (transformers 4's spelling of the
    Gemma 3 tower's, its projector's weights as `.weight`); None for what it leaves out."""
    if ".head." in name:  # SigLIP's pooling head
        return None
    if name.startswith("model.vision_tower."):
        return "vision_tower.vision_model." + name.removeprefix("model.vision_tower.")
    if name.startswith("model.multi_modal_projector."):
        return name.removeprefix("model.").replace("_weight", ".weight")
    if name.startswith(("model.vision_model.", "model.connector.")):
        return name
    return None


def _f32(gguf: str, tensor: torch.Tensor, ftype: str) -> bool:
    """Whether the converter keeps the tensor F32 in a file of `ftype`."""
    embedding = gguf.startswith(("v.patch_embd.", "v.position_embd."))
    return ftype == "f32" or tensor.dim() < 2 or embedding


def _q8_0(tensor: torch.Tensor, ftype: str) -> bool:
    """Whether a q8_0 file stores the (matrix) tensor as Q8_0 blocks: rows of whole blocks of 32;
    others stay F16, as the converter falls back."""
    return ftype == "q8_0" and tensor.dim() == 2 and tensor.shape[-1] % 32 == 0


def _rounded(array: np.ndarray) -> np.ndarray:
    """What a Q8_0 file's blocks of `array` read back as."""
    blocks = quants.quantize(array, GGMLQuantizationType.Q8_0)
    return quants.dequantize(blocks, GGMLQuantizationType.Q8_0).reshape(array.shape)


def mmproj_tensors(vlm, ftype: str = "f16") -> dict[str, np.ndarray]:
    """llama.cpp's name -> the array an mmproj file of `ftype` stores, in the file's order."""
    names = get_tensor_name_map(MODEL_ARCH.MMPROJ, vlm.config.vision_config.num_hidden_layers)
    out = {}
    for name, tensor in vlm.state_dict().items():
        source = _hf_name(name)
        if source is None:
            continue
        gguf = names.get_name(source, try_suffixes=(".weight", ".bias"))
        assert gguf is not None, f"gguf-py has no mmproj name for {source}"
        tensor = tensor.detach().float()
        if "soft_emb_norm" in gguf:
            tensor = tensor + 1  # Gemma3RMSNorm's (1 + w), as the converter stores it
        array = tensor.contiguous().numpy()
        if _f32(gguf, tensor, ftype):
            out[gguf] = array
        elif _q8_0(tensor, ftype):  # its blocks' bytes (uint8), written as Q8_0
            out[gguf] = quants.quantize(array, GGMLQuantizationType.Q8_0)
        else:
            out[gguf] = array.astype(np.float16)
    return out


def mmproj_metadata(vlm, kind: str, image_processor) -> dict:
    """The `clip.*` keys the converter writes for the VLM (its image processor's settings)."""
    config, vision = vlm.config, vlm.config.vision_config
    metadata = {
        "general.type": "mmproj",
        "clip.has_vision_encoder": True,
        "clip.projector_type": PROJECTOR[kind],
        "clip.use_gelu": True,
        "clip.vision.projection_dim": config.text_config.hidden_size,
        "clip.vision.image_size": vision.image_size,
        "clip.vision.patch_size": vision.patch_size,
        "clip.vision.embedding_length": vision.hidden_size,
        "clip.vision.feed_forward_length": vision.intermediate_size,
        "clip.vision.block_count": vision.num_hidden_layers,
        "clip.vision.attention.head_count": vision.num_attention_heads,
        "clip.vision.attention.layer_norm_epsilon": vision.layer_norm_eps,
        "clip.vision.image_mean": [float(v) for v in image_processor.image_mean],
        "clip.vision.image_std": [float(v) for v in image_processor.image_std],
    }
    side = vision.image_size // vision.patch_size
    if kind == "gemma3":
        scale = side // int(config.mm_tokens_per_image**0.5)
        if scale != 4:  # the converter writes it only where it is not llama.cpp's default
            metadata["clip.vision.projector.scale_factor"] = scale
    else:
        metadata["clip.vision.projector.scale_factor"] = config.scale_factor
        metadata["clip.vision.preproc_image_size"] = image_processor.size["longest_edge"]
    return metadata


def write_mmproj(
    vlm,
    kind: str,
    image_processor,
    path: Path,
    ftype: str = "f16",
    edit: Callable[[dict, dict], None] | None = None,
) -> Path:
    """The VLM's image encoder as an mmproj GGUF file of `ftype` ('f16', 'f32' or 'q8_0');
    `edit(metadata, tensors)` changes what is written (a malformed file's)."""
    metadata = mmproj_metadata(vlm, kind, image_processor)
    tensors = mmproj_tensors(vlm, ftype)
    if edit is not None:
        edit(metadata, tensors)
    writer = GGUFWriter(str(path), "clip")
    for key, value in metadata.items():
        if key == "general.type":
            writer.add_type(value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_array(key, value)
    for name, array in tensors.items():
        if array.dtype == np.uint8:  # Q8_0 blocks
            writer.add_tensor(name, array, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
    return gguf_writer.finish(writer, path)


def reference(vlm, ftype: str = "f16"):
    """A copy of the VLM whose image encoder's weights are the file's (an f16 file's rounded)."""
    if ftype == "f32":
        return vlm
    names = get_tensor_name_map(MODEL_ARCH.MMPROJ, vlm.config.vision_config.num_hidden_layers)
    copied = copy.deepcopy(vlm)
    with torch.no_grad():
        for name, param in copied.named_parameters():
            source = _hf_name(name)
            gguf = source and names.get_name(source, try_suffixes=(".weight", ".bias"))
            if not gguf or _f32(gguf, param, ftype):
                continue
            if _q8_0(param, ftype):
                param.copy_(torch.from_numpy(_rounded(param.detach().float().numpy())))
            else:
                param.copy_(param.half().float())
    return copied.eval()


def image_processor(kind: str, processor):
    """The image processor the reference's prompts are made with."""
    if kind == "gemma3":
        return processor.image_processor
    return idefics3_models.image_processor(kind)


def write_pair(kind: str, directory: Path, ftype: str = "f16", **text_changes):
    """The VLM's safetensors checkpoint (in `directory`/hf) and its llama.cpp files (`directory`/
    gguf: model.gguf, mmproj-model-{ftype}.gguf); returns (model, processor, text GGUF path,
    mmproj path)."""
    hf, files = directory / "hf", directory / "gguf"
    hf.mkdir(parents=True)
    files.mkdir(parents=True)
    model, processor = save(kind, hf, **text_changes)
    text = write_text_gguf(model, kind, processor.tokenizer, files / "model.gguf")
    mmproj = write_mmproj(
        model, kind, image_processor(kind, processor), files / f"mmproj-model-{ftype}.gguf", ftype
    )
    return model, processor, text, mmproj
