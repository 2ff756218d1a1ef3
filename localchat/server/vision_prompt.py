"""A chat request with pictures (OpenAI `image_url` parts), for a vision-language model: the
messages rendered with the chat template, an image part standing where the template puts the
model's image marker; then the model's own processor (transformers' AutoProcessor; for a GGUF
model, the one made from its mmproj file's metadata, engine/loading/mmproj.py) expands each marker
into the image's placeholder tokens and makes its pixel values. A model that takes no
images, and every bad picture, is a 400 naming the part (`messages[0].content[1].image_url`).

SmolVLM's and Idefics3's processors cut a picture into tiles plus the whole picture scaled down,
each with a run of placeholder tokens of its own: each tile is an ImageInput. SmolVLMProcessor
wants num2words and torchvision (for videos) to be built at all; without them its images are
processed by a stand-in that only skips its video processor (`_smolvlm_images`)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from localchat.engine.core.engine_client import EngineClient
from localchat.engine.core.multimodal import ImageInput, placeholder_runs
from localchat.errors import InvalidParameterError, UnsupportedModelError
from localchat.server.images import image_from_url
from localchat.server.protocol import ChatCompletionRequest
from localchat.server.state import ServerState


def image_parts(data: ChatCompletionRequest) -> list[tuple[str, str]]:
    """(field name, URL) of every image part, in order."""
    found = []
    for i, message in enumerate(data.messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            if part.type in ("image_url", "input_image", "image"):
                field = f"messages[{i}].content[{j}].image_url"
                if part.image_url is None:
                    raise InvalidParameterError(
                        f"{field}: an image part needs its url", param=field
                    )
                found.append((field, part.image_url.url))
    return found


@functools.lru_cache(maxsize=4)
def load_processor(directory: str):
    """The model's own processor (transformers' AutoProcessor) from `directory`."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(directory)
    except ImportError as exc:  # a package the processor wants for something other than images
        if getattr(_model_config(directory), "model_type", None) == "smolvlm":
            return _smolvlm_images(directory)
        raise UnsupportedModelError(
            f"the model's processor cannot be loaded: {str(exc).strip()}"
        ) from None


def _smolvlm_images(directory: str):
    """SmolVLMProcessor without its video processor (and the num2words its videos' prompts use):
    its own image processor, tokenizer and prompt expansion."""
    from transformers import AutoImageProcessor, AutoTokenizer, ProcessorMixin
    from transformers.models.smolvlm.processing_smolvlm import SmolVLMProcessor

    class SmolVLMImages(SmolVLMProcessor):
        apply_chat_template = ProcessorMixin.apply_chat_template  # SmolVLM's reads its videos'

        def __init__(self, image_processor, tokenizer, image_seq_len: int, chat_template=None):
            # SmolVLMProcessor.__init__'s image settings
            self.fake_image_token = getattr(
                tokenizer, "fake_image_token", "<fake_token_around_image>"
            )
            self.image_token = getattr(tokenizer, "image_token", "<image>")
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.end_of_utterance_token = getattr(
                tokenizer, "end_of_utterance_token", "<end_of_utterance>"
            )
            self.global_image_token = getattr(tokenizer, "global_image_token", "<global-img>")
            self.image_seq_len = image_seq_len
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    config = _model_config(directory)  # a tile's tokens, as the processor's image_seq_len
    side = config.vision_config.image_size // config.vision_config.patch_size
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return SmolVLMImages(
        AutoImageProcessor.from_pretrained(directory),
        tokenizer,
        (side // config.scale_factor) ** 2,
        getattr(tokenizer, "chat_template", None),
    )


@functools.lru_cache(maxsize=4)
def _model_config(directory: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(directory)


def render_with_images(
    server: ServerState,
    data: ChatCompletionRequest,
    tools: list[dict] | None,
    parts: list[tuple[str, str]],
) -> tuple[list[int], tuple[ImageInput, ...]]:
    """The prompt's token ids and its images."""
    return render_images_with(
        server.engine, lambda marked: server.render_chat(marked, tools), data, parts
    )


def render_images_with(
    engine: EngineClient,
    render: Callable[[ChatCompletionRequest], list[int]],
    data: ChatCompletionRequest,
    parts: list[tuple[str, str]],
) -> tuple[list[int], tuple[ImageInput, ...]]:
    """The prompt's token ids and its images, the messages rendered by `render` (the server's
    template options, or the chat's) with each image part where the template puts its marker."""
    info = engine.model_info
    if not info.takes_images:
        field = parts[0][0]
        raise InvalidParameterError(
            f"{field}: {info.name} takes no images (not a vision-language model, or loaded "
            "without its image encoder)",
            param=field,
        )
    pictures = [image_from_url(url, field) for field, url in parts]
    # the template sees {"type": "image"} where the request has its image_url part
    marked = render(_with_image_markers(data))
    text = engine.detokenize(marked, skip_special_tokens=False)
    directory = str(info.processor_dir or info.config_dir)
    processor = load_processor(directory)
    try:
        inputs = processor(text=text, images=pictures, add_special_tokens=False)
    except (ValueError, TypeError) as exc:  # the processor refusing a picture or its count
        raise InvalidParameterError(
            f"the images could not be processed: {exc}", param="messages"
        ) from None
    token_ids = [int(t) for t in inputs["input_ids"][0]]
    config = _model_config(directory)
    runs = placeholder_runs(token_ids, int(config.image_token_id))
    pixels = _tiles(inputs, int(config.vision_config.image_size))
    if len(runs) != len(pixels):
        raise InvalidParameterError(
            f"the chat template placed {len(runs)} of the {len(pixels)} images' placeholders",
            param="messages",
        )
    images = tuple(ImageInput.of(pixels[i], o, n) for i, (o, n) in enumerate(runs))
    return token_ids, images


def _tiles(inputs, size: int):
    """The processor's pixel values as [images or tiles, channels, size, size]."""
    import numpy as np
    import torch

    pixels = torch.from_numpy(np.asarray(inputs["pixel_values"]))
    if pixels.dim() == 5:  # [prompts, tiles, ...] (SmolVLM, Idefics3): one prompt, none padded
        pixels = pixels[0]
        mask = inputs.get("pixel_attention_mask")
        if mask is not None and not np.asarray(mask).all():
            raise UnsupportedModelError(
                "the image processor padded an image tile (pixel_attention_mask); tiles with "
                "padding are not supported"
            )
    if tuple(pixels.shape[-2:]) != (size, size):
        height, width = pixels.shape[-2:]
        raise UnsupportedModelError(
            f"the image processor makes {height} x {width} pixel images or tiles, but the vision "
            f"tower takes {size} x {size} (its config's image_size)"
        )
    return pixels


def _with_image_markers(data: ChatCompletionRequest) -> ChatCompletionRequest:
    import msgspec

    from localchat.server.protocol import ContentPart

    messages = []
    for message in data.messages:
        if isinstance(message.content, list):
            content = [
                ContentPart(type="image") if part.image_url is not None else part
                for part in message.content
            ]
            message = msgspec.structs.replace(message, content=content)
        messages.append(message)
    return msgspec.structs.replace(data, messages=messages)
