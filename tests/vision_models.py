"""A tiny random-weight Gemma 3 vision-language model, built with transformers' own classes
(Gemma3ForConditionalGeneration: a SigLIP tower, the multi-modal projector, the Gemma 3 text
model) and saved with its processor (Gemma3Processor: the image processor and a byte-level test
tokenizer with Gemma's and the image's special tokens, and a chat template that places an image
part's <start_of_image> as Gemma 3's does): the reference the vision tests hold ours against.

The images are IMAGE_SIZE pixels square, cut into patches of PATCH pixels (a 4 x 4 grid) that the
projector pools 2 x 2 into IMAGE_TOKENS soft tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.family_models import _BASE, FAMILIES, VOCAB

IMAGE_SIZE = 32
PATCH = 8
IMAGE_TOKENS = 4
# the vision towers' sizes (tests/idefics3_models.py's too)
VISION_SIZES = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
)
BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<start_of_turn>' + ('model' if message.role == 'assistant' else 'user') + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content | trim -}}"
    "{%- else -%}{%- for part in message.content -%}"
    "{%- if part.type == 'image' -%}{{- '<start_of_image>' -}}"
    "{%- elif part.type == 'text' -%}{{- part.text | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)


def byte_tokenizer(specials: list[str], **options):
    """Byte-level BPE over the 256 byte symbols (ids 0-255), then `specials` (ids from 256 on);
    `options` go to PreTrainedTokenizerFast (the special tokens' roles, the chat template)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return PreTrainedTokenizerFast(tokenizer_object=backend, **options)


def tokenizer():
    """Byte-level BPE over the 256 byte symbols, then Gemma's and the image's special tokens."""
    specials = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", BOI, EOI, IMAGE]
    return byte_tokenizer(
        specials,
        eos_token="<eos>",
        bos_token="<bos>",
        pad_token="<pad>",
        extra_special_tokens={"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE},
        chat_template=TEMPLATE,
    )


def config(tok, **text_changes):
    import transformers

    _, _, overrides = FAMILIES["gemma3"]
    ids = {t: tok.convert_tokens_to_ids(t) for t in (BOI, EOI, IMAGE)}
    vocab = max(VOCAB, -(-len(tok) // 64) * 64)
    text = transformers.Gemma3TextConfig(
        **{
            **_BASE,
            **overrides,
            "vocab_size": vocab,
            "pad_token_id": 256,
            "eos_token_id": 257,
            "bos_token_id": 258,
            **text_changes,
        }
    )
    vision = transformers.SiglipVisionConfig(
        **VISION_SIZES, image_size=IMAGE_SIZE, patch_size=PATCH, layer_norm_eps=1e-6
    )
    return transformers.Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=IMAGE_TOKENS,
        boi_token_index=ids[BOI],
        eoi_token_index=ids[EOI],
        image_token_index=ids[IMAGE],
        tie_word_embeddings=False,
    )


def draw_weights(model, vision: str, text_norm: float):
    """`model` with its weights drawn wide: the norms of the vision tower (parameters named with
    `vision`) around 1, the text model's around `text_norm` (0 for Gemma's (1 + weight) norms)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0 if vision in name else text_norm, 0.3)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.2)
            else:
                param.normal_(0.0, 0.1)
    return model


def build(seed: int = 0, **text_changes):
    """The tiny Gemma 3 VLM (float32, eval) with weights drawn wide (tests/family_models.py) and
    its processor."""
    import transformers

    tok = tokenizer()
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config(tok, **text_changes))
    model = draw_weights(model.to(torch.float32).eval(), "vision_tower", text_norm=0.0)
    image_processor = transformers.Gemma3ImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = transformers.Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tok,
        chat_template=TEMPLATE,
        image_seq_length=IMAGE_TOKENS,
    )
    return model, processor


def save(directory: Path, seed: int = 0, **text_changes):
    """Save the model (safetensors) and its processor in `directory`; returns (model, processor)."""
    model, processor = build(seed, **text_changes)
    model.save_pretrained(directory, safe_serialization=True)
    processor.save_pretrained(directory)
    return model, processor


def images(count: int, seed: int = 0):
    """`count` random RGB PIL images of different sizes."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        size = (40 + 8 * i, 24 + 4 * i)
        pixels = torch.randint(
            0, 256, (size[1], size[0], 3), generator=generator, dtype=torch.uint8
        )
        out.append(Image.fromarray(pixels.numpy(), "RGB"))
    return out


def chat_inputs(processor, text: str, pictures: list, **options) -> dict:
    """The processor's tensors for one user message of `pictures` then `text`, rendered with its
    chat template; `options` go to the processor (its image processor's settings)."""
    parts = [{"type": "image"} for _ in pictures] + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": parts}]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=rendered, images=pictures or None, return_tensors="pt", **options)


def hf_greedy(model, inputs, new_tokens: int) -> list[int]:
    """transformers' greedy tokens after the prompt, EOS not stopping them."""
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def image_request(model, inputs, tokens_per_image: int = IMAGE_TOKENS) -> tuple[list[int], tuple]:
    """Our (prompt ids, ImageInputs) request of the processor's `inputs` (an Idefics3 processor's
    tiles, [1, tiles, 3, H, W], each an image of `tokens_per_image` tokens)."""
    from localchat.engine.core.multimodal import images_of_prompt

    ids = inputs["input_ids"][0].tolist()
    if "pixel_values" not in inputs:
        return ids, ()
    pixels = inputs["pixel_values"]
    pixels = pixels[0] if pixels.dim() == 5 else pixels
    return ids, images_of_prompt(ids, pixels, model.config.image_token_id, tokens_per_image)


def prompt_logprobs(llm, model, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(ours, transformers') logprob of each prompt token after the first."""
    from localchat import SamplingParams

    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    ids = inputs["input_ids"][0]
    expected = logits.log_softmax(-1)[:-1].gather(1, ids[1:, None])[:, 0]
    prompt, pictures = image_request(model, inputs)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    llm.engine.add_request(f"logprobs-{id(inputs)}", prompt, params, images=pictures)
    found = None
    while llm.engine.has_unfinished():
        for output in llm.engine.step():
            found = output.prompt_logprobs or found
    assert found is not None and found[0] is None
    return torch.tensor([entry.logprob for entry in found[1:]]), expected


def tiny_llm(directory, **kwargs):
    """Our engine on a tiny VLM's directory (256 tokens of context)."""
    from localchat import LLM

    return LLM(str(directory), max_model_len=256, kv_cache_memory="16MiB", **kwargs)


def run_engine(llm, requests: list[tuple[list[int], tuple]], new_tokens: int) -> list[list[int]]:
    """Our greedy tokens for each (prompt ids, images) request, all added at once, EOS ignored."""
    from localchat import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    ids = [
        f"r{id(llm)}-{i}-{len(engine.requests)}-{engine.stats().prompt_tokens_total}"
        for i in range(len(requests))
    ]
    handles = [
        engine.add_request(rid, prompt, params, images=pictures)
        for rid, (prompt, pictures) in zip(ids, requests, strict=True)
    ]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for output in engine.step():
            tokens[output.request_id].extend(output.outputs[0].token_ids)
    assert all(h.is_finished for h in handles)
    return [tokens[rid] for rid in ids]
