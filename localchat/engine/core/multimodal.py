"""Images in a prompt: each one's pixel values (as the model's own image processor made them), its
placeholder tokens' place in the prompt and a hash of its content; the encoder cache that encodes
an image once however many steps and requests read it; and what the scheduler, the prefix cache and
the model runner need to know about a sequence's images.

A model whose image tokens attend to each other both ways (Gemma 3) must compute the rest of an
image's tokens in one forward pass: a prefill chunk never ends inside an image there
(`whole_images`). A chunk may start inside one (after a prefix-cache hit), since the cached keys
were computed with the whole image. A full KV block that holds image tokens is keyed by the images'
hashes too (`block_images`), so a different picture behind the same placeholder tokens never hits.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image of a prompt: pixel values [channels, height, width], the position of its first
    placeholder token, how many there are, and a hash of the pixel values."""

    pixel_values: torch.Tensor
    offset: int
    length: int
    content_hash: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    @classmethod
    def of(cls, pixel_values: torch.Tensor, offset: int, length: int) -> ImageInput:
        return cls(pixel_values, offset, length, pixel_hash(pixel_values))


def pixel_hash(pixel_values: torch.Tensor) -> int:
    """A 63-bit hash of the pixel values (shape, dtype and bytes), the same in every process."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(repr((tuple(pixel_values.shape), str(pixel_values.dtype))).encode())
    digest.update(pixel_values.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(digest.digest(), "little") >> 1


def placeholder_runs(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """(offset, length) of each run of `image_token_id` in the prompt, in order."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, token in enumerate([*token_ids, None]):
        if token == image_token_id and start is None:
            start = i
        elif token != image_token_id and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


def images_of_prompt(
    token_ids: Sequence[int], pixel_values: torch.Tensor, image_token_id: int, tokens_per_image: int
) -> tuple[ImageInput, ...]:
    """The ImageInputs of a processed prompt: the i-th run of placeholder tokens is the i-th
    image's. ValueError where the runs and the images do not match."""
    runs = placeholder_runs(token_ids, image_token_id)
    if len(runs) != len(pixel_values):
        raise ValueError(
            f"the prompt holds {len(runs)} images' tokens for {len(pixel_values)} images"
        )
    for _, length in runs:
        if length != tokens_per_image:
            raise ValueError(f"an image has {length} placeholder tokens, not {tokens_per_image}")
    return tuple(ImageInput.of(p, o, n) for p, (o, n) in zip(pixel_values, runs, strict=True))


def whole_images(images: Sequence[ImageInput], start: int, num_new: int) -> int:
    """The most tokens (at most `num_new`) a chunk from `start` may compute without ending inside
    an image; 0 where even the image it starts in does not fit."""
    end = start + num_new
    for image in images:
        if image.offset < end < image.end:
            return 0 if image.offset <= start else image.offset - start
    return num_new


def block_images(images: Sequence[ImageInput], first: int, last: int) -> tuple:
    """What a KV block over positions [first, last) holds beside its token ids: (hash, offset)
    of each image with tokens in it."""
    return tuple(
        (image.content_hash, image.offset)
        for image in images
        if image.offset < last and first < image.end
    )


class EncoderCache:
    """The image embeddings encoded last, by content hash, up to `capacity` bytes (least recently
    used dropped first): the steps of one prompt and the turns of a chat about the same picture
    encode it once."""

    def __init__(self, encode: Callable[[torch.Tensor], torch.Tensor], capacity: int = 256 << 20):
        self.encode = encode
        self.capacity = capacity
        self.entries: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.size = 0
        self.num_encoded = 0  # images run through the encoder

    def get(self, images: Sequence[ImageInput]) -> list[torch.Tensor]:
        """Each image's embeddings [tokens, hidden], encoding those not cached in one batch."""
        todo = {
            image.content_hash: image for image in images if image.content_hash not in self.entries
        }
        if todo:
            batch = torch.stack([image.pixel_values for image in todo.values()])
            for key, rows in zip(todo, self.encode(batch), strict=True):
                self._put(key, rows)
            self.num_encoded += len(todo)
        found = []
        for image in images:
            rows = self.entries.get(image.content_hash)
            if rows is None:  # evicted by the others of this very batch: encode it alone
                rows = self.encode(image.pixel_values[None])[0]
                self.num_encoded += 1
            else:
                self.entries.move_to_end(image.content_hash)
            found.append(rows)
        return found

    def _put(self, key: int, rows: torch.Tensor) -> None:
        self.entries[key] = rows
        self.size += rows.numel() * rows.element_size()
        while self.size > self.capacity and len(self.entries) > 1:
            _, dropped = self.entries.popitem(last=False)
            self.size -= dropped.numel() * dropped.element_size()


@dataclass
class StepImages:
    """A step's image rows: the flat token rows whose embeddings are an image's (`rows`, with
    `embeddings` [len(rows), hidden]), and for bidirectional attention each span of image
    queries (flat rows [q_start, q_end), batch row `seq_row`, whose keys end at `key_end`)."""

    rows: torch.Tensor
    embeddings: torch.Tensor
    spans: list[tuple[int, int, int, int]]


def step_images(
    chunks: Sequence[tuple[Sequence[ImageInput], int, int, int]],
    cache: EncoderCache,
    bidirectional: bool,
    device: torch.device,
) -> StepImages | None:
    """The images of a step's chunks: (images, first position, end position, first flat row) per
    batch row (in the batch's order); None where no chunk holds an image token."""
    rows: list[int] = []
    pieces: list[torch.Tensor] = []
    spans: list[tuple[int, int, int, int]] = []
    for seq_row, (images, start, end, flat) in enumerate(chunks):
        inside = [image for image in images if image.offset < end and start < image.end]
        if not inside:
            continue
        for image, embedded in zip(inside, cache.get(inside), strict=True):
            lo, hi = max(start, image.offset), min(end, image.end)
            rows.extend(range(flat + lo - start, flat + hi - start))
            pieces.append(embedded[lo - image.offset : hi - image.offset])
            if bidirectional and hi - lo > 1:
                spans.append((flat + lo - start, flat + hi - start, seq_row, image.end))
    if not rows:
        return None
    return StepImages(
        torch.tensor(rows, dtype=torch.int64, device=device), torch.cat(pieces).to(device), spans
    )
