"""A chat request with pictures (OpenAI `image_url` parts), for a vision-language model: the
messages rendered with the chat template, an image part standing where the template puts the
model's image marker; then the model's own processor (transformers' AutoProcessor) expands each
marker into the image's placeholder tokens and makes its pixel values. A model that takes no
images, and every bad picture, is a 400 naming the part (`messages[0].content[1].image_url`)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from localchat.engine.core.engine_client import EngineClient
from localchat.engine.core.multimodal import ImageInput, placeholder_runs
from localchat.errors import InvalidParameterError
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
def _processor(directory: str):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(directory)


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
    processor = _processor(str(info.config_dir))
    try:
        inputs = processor(text=text, images=pictures, add_special_tokens=False)
    except (ValueError, TypeError) as exc:  # the processor refusing a picture or its count
        raise InvalidParameterError(
            f"the images could not be processed: {exc}", param="messages"
        ) from None
    token_ids = [int(t) for t in inputs["input_ids"][0]]
    kinds = inputs.get("token_type_ids", inputs.get("mm_token_type_ids"))
    runs = placeholder_runs([int(k) for k in kinds[0]], 1)
    if len(runs) != len(pictures):
        raise InvalidParameterError(
            f"the chat template placed {len(runs)} of the {len(pictures)} images", param="messages"
        )
    pixels = _as_tensor(inputs["pixel_values"])
    images = tuple(ImageInput.of(pixels[i], o, n) for i, (o, n) in enumerate(runs))
    return token_ids, images


def _as_tensor(values):
    import numpy as np
    import torch

    return values if isinstance(values, torch.Tensor) else torch.from_numpy(np.asarray(values))


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
