"""Tiny random-weight SmolVLM and Idefics3 vision-language models, built with transformers' own
classes (SmolVLMForConditionalGeneration, Idefics3ForConditionalGeneration: a SigLIP-style tower,
the connector's pixel shuffle and projection, a Llama text model) and saved with their processors:
the references the vision tests hold ours against.

The vision tower takes TILE-pixel squares in patches of PATCH pixels (a 4 x 4 grid), which the
connector shuffles 2 x 2 into TILE_TOKENS tokens. The image processor first scales a picture's
longest edge to LONGEST_EDGE (two tiles): a picture then becomes 2 x 2 (or 1 x 2, 2 x 1) tiles
plus the whole picture scaled to one tile, each tile's tokens in a run of their own between
<fake_token_around_image> and <row_r_col_c> (<global-img> for the whole picture). With
`size={"longest_edge": TILE}` a picture is one tile.

Idefics3's processor is transformers' Idefics3Processor. SmolVLM's, SmolVLMProcessor, needs
num2words and torchvision (for videos) to be built, so its files are written from its parts (the
image processor, the tokenizer, processor_config.json) and the reference expands prompts with
localchat's stand-in for it (server/vision_prompt.py), which the tests check against
Idefics3Processor's expansion.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.family_models import _BASE
from tests.vision_models import VISION_SIZES, byte_tokenizer, draw_weights

TILE = 32
PATCH = 8
TILE_TOKENS = 4
LONGEST_EDGE = 2 * TILE
KINDS = ("smolvlm", "idefics3")
IMAGE, FAKE, GLOBAL = "<image>", "<fake_token_around_image>", "<global-img>"
ROW_COL = [f"<row_{r + 1}_col_{c + 1}>" for r in range(6) for c in range(6)]
# SmolVLM2's template, strings as content too
TEMPLATE = (
    "<|im_start|>"
    "{%- for message in messages -%}"
    "{{- message.role | capitalize -}}"
    "{%- if message.content is string -%}{{- ': ' + message.content -}}"
    "{%- else -%}"
    "{{- ':' if message.content[0].type == 'image' else ': ' -}}"
    "{%- for part in message.content -%}"
    "{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type == 'image' -%}{{- '<image>' -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_utterance>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)


def tokenizer():
    specials = ["<|endoftext|>", "<|im_start|>", "<end_of_utterance>", FAKE, IMAGE, GLOBAL]
    return byte_tokenizer(
        specials + ROW_COL,
        eos_token="<end_of_utterance>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE,
    )


def config(kind: str, tok):
    import transformers

    prefix = "SmolVLM" if kind == "smolvlm" else "Idefics3"
    text = transformers.LlamaConfig(
        **{
            **_BASE,
            "vocab_size": -(-len(tok) // 64) * 64,
            "pad_token_id": 256,
            "bos_token_id": 257,
            "eos_token_id": 258,
            "head_dim": 16,
        }
    )
    vision = getattr(transformers, f"{prefix}VisionConfig")(
        **VISION_SIZES, image_size=TILE, patch_size=PATCH
    )
    return getattr(transformers, f"{prefix}Config")(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids(IMAGE),
        tie_word_embeddings=False,
    )


def image_processor(kind: str):
    import transformers

    name = "SmolVLMImageProcessorPil" if kind == "smolvlm" else "Idefics3ImageProcessorPil"
    return getattr(transformers, name)(
        size={"longest_edge": LONGEST_EDGE}, max_image_size={"longest_edge": TILE}
    )


def build(kind: str, seed: int = 2):
    """The tiny model (float32, eval) with weights drawn wide, and for Idefics3 its processor (for
    SmolVLM its tokenizer). The default seed's model answers the tests' pictures with varied
    tokens, where others' soon repeat one."""
    import transformers

    tok = tokenizer()
    torch.manual_seed(seed)
    name = (
        "SmolVLMForConditionalGeneration"
        if kind == "smolvlm"
        else "Idefics3ForConditionalGeneration"
    )
    model = getattr(transformers, name)(config(kind, tok)).to(torch.float32).eval()
    model = draw_weights(model, "vision_model", text_norm=1.0)
    if kind == "smolvlm":
        return model, tok
    processor = transformers.Idefics3Processor(
        image_processor=image_processor(kind),
        tokenizer=tok,
        image_seq_len=TILE_TOKENS,
        chat_template=TEMPLATE,
    )
    return model, processor


def save(kind: str, directory: Path, seed: int = 2):
    """Save the model (safetensors) and its processor's files in `directory`; returns (model,
    processor), the processor as the server loads it (server/vision_prompt.py)."""
    from localchat.server.vision_prompt import load_processor

    model, processor = build(kind, seed)
    model.save_pretrained(directory, safe_serialization=True)
    if kind == "smolvlm":  # SmolVLMProcessor's files, written from its parts
        processor.save_pretrained(directory)
        image_processor(kind).save_pretrained(directory)
        settings = {"processor_class": "SmolVLMProcessor", "image_seq_len": TILE_TOKENS}
        (directory / "processor_config.json").write_text(json.dumps(settings))
        (directory / "chat_template.jinja").write_text(TEMPLATE)
    else:
        processor.save_pretrained(directory)
    return model, load_processor(str(directory))
