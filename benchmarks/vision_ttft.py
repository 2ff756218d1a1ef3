"""Vision TTFT (issue 44): the time to the first token of a chat with one 896 x 896 picture and a
32-token question on the CPU, localchat against llama.cpp's multimodal path (llama-cpp-python's
mtmd bindings) on the same GGUF pair, greedy.

The pair is Gemma 3 4B-shaped with random weights, written once (kept in --dir, else under
$LOCALCHAT_CACHE_DIR/bench/vision-ttft): the text model as a Q4_K_M (or --quant q4_0) GGUF of
Gemma 3 4B's config (localchat.bench.gguf_shapes' "gemma3-4b": hidden 2560, 34 layers, 8 heads, 4
KV heads, head_dim 256, intermediate 10240, a 1024-token window on five layers of six, tied
embeddings), with a 262,144-token sentencepiece vocabulary of byte tokens and Gemma 3's special
tokens, and Gemma 3's chat template; and its f16 mmproj GGUF, Gemma 3's SigLIP tower (896-pixel
images in 14-pixel patches, hidden 1152, 27 layers, 16 heads, intermediate 4304; 256 image tokens
after the 4 x 4 pooling) under llama.cpp's names, types and `clip.*` metadata, as its converter
writes them (tests/mmproj_models.py writes the tests' tiny ones the same way). --text and --mmproj
take another pair; --tiny writes and runs a small one in seconds.

Each system runs in a process of its own, kept loaded (localchat.bench.isolated, as C4), and the
two take turns for --rounds paired rounds, each round in the other order than the last, after one
warm-up request each. A round is one request: the prompt text (the chat template's, rendered once)
and a picture's raw RGB pixels in, the first token out; the picture is another one each round (the
same set for both systems), so neither a prefix cache nor an encoder cache serves a round from
another. Each system's TTFT counts its image preprocessing (scaling, normalizing), the prompt's
tokenization, the image encoder, the prefill and the first greedy token; the encoder's share is
timed apart:

- localchat: LLM(text, mmproj=...), the picture through the image processor made from the mmproj's
  metadata (as the server does), LLMEngine.add_request with the image, then engine steps;
- llama.cpp: llama-cpp-python's Llama on the text GGUF, mtmd_init_from_file on the mmproj, then
  mtmd_bitmap_init, mtmd_tokenize and each chunk evaluated as mtmd_helper_eval_chunk_single does
  (an image chunk's mtmd_encode_chunk timed, then mtmd_helper_decode_image_chunk), the first token
  the argmax of the last logits.

Both prompts are the same tokens: llama.cpp's text is the template's with the image marker where
Gemma3Processor puts the image (between blank lines), and mtmd adds <start_of_image> and
<end_of_image> around it as the processor does (checked every run: "prompts identical").

    python benchmarks/vision_ttft.py --rounds 4 --threads 2 --json vision_ttft.json
    python benchmarks/vision_ttft.py --tiny   # a small pair, end to end in seconds
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import datetime
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from localchat.bench.isolated import IsolatedSystem
from localchat.bench.isolated_child import IsolatedSpec

SYSTEMS = ("localchat", "llama.cpp")
FILE_VERSION = 1  # bump when the pair written changes, so a cached one is made again
QUESTION = "What is in this picture? Briefly"  # 32 tokens of the byte-level vocabulary below
WARM_UP_PICTURE = -1  # the picture each system warms up on, none of the rounds'
# Gemma 3's special tokens, at the ids of the real vocabulary's first ones (pad, eos, bos, unk)
SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<mask>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
]
BOS, EOS, PAD, UNK = 2, 1, 0, 3
# google/gemma-3-4b-it's chat template
CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/'
    '...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)
MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]


# --- the pair of files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionShape:
    """Gemma 3's SigLIP tower as an mmproj file describes it."""

    image_size: int
    patch_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    scale: int = 4  # Gemma 3's pooling: patches a side per image token a side

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size // self.scale) ** 2


@dataclass(frozen=True)
class PairShape:
    name: str
    text: object  # gguf_shapes.ModelShape
    vision: VisionShape
    vocab_size: int


def pair_shape(tiny: bool) -> PairShape:
    from localchat.bench.gguf_shapes import PRESETS

    full = PRESETS["gemma3-4b"]
    if not tiny:
        return PairShape("gemma3-4b", full, VisionShape(896, 14, 1152, 27, 16, 4304), 262144)
    # Q4_K rows are 256 values: every matrix's input a multiple of 256
    text = replace(
        full,
        name="gemma3-tiny",
        hidden_size=256,
        num_layers=6,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=512,
        head_dim=128,
        sliding_window=64,
    )
    return PairShape("gemma3-tiny", text, VisionShape(224, 14, 64, 2, 4, 128), 512)


def gemma_tokenizer(vocab_size: int):
    """`tokenizer.*` fields (random_gguf.TokenizerFields) of a Gemma-style sentencepiece
    vocabulary: Gemma 3's special tokens, the 256 byte tokens, the word-start mark, then unused
    tokens up to `vocab_size`; Gemma 3's chat template."""
    from gguf import GGUFValueType, TokenType

    tokens = [*SPECIAL_TOKENS, *(f"<0x{b:02X}>" for b in range(256)), "\u2581"]
    types = [TokenType.CONTROL] * len(SPECIAL_TOKENS) + [TokenType.BYTE] * 256
    types[UNK] = TokenType.UNKNOWN
    types.append(TokenType.NORMAL)
    padding = vocab_size - len(tokens)
    tokens += [f"<unused{i}>" for i in range(padding)]
    types += [TokenType.UNUSED] * padding
    v = GGUFValueType
    fields = [
        ("tokenizer.ggml.model", "llama", v.STRING, None),
        ("tokenizer.ggml.tokens", tokens, v.ARRAY, v.STRING),
        ("tokenizer.ggml.scores", [0.0] * vocab_size, v.ARRAY, v.FLOAT32),
        ("tokenizer.ggml.token_type", [int(t) for t in types], v.ARRAY, v.INT32),
        ("tokenizer.ggml.bos_token_id", BOS, v.UINT32, None),
        ("tokenizer.ggml.eos_token_id", EOS, v.UINT32, None),
        ("tokenizer.ggml.unknown_token_id", UNK, v.UINT32, None),
        ("tokenizer.ggml.padding_token_id", PAD, v.UINT32, None),
        ("tokenizer.ggml.add_bos_token", False, v.BOOL, None),  # the template writes <bos>
        ("tokenizer.ggml.add_space_prefix", False, v.BOOL, None),
        ("tokenizer.chat_template", CHAT_TEMPLATE, v.STRING, None),
    ]
    return fields, vocab_size


def mmproj_tensors(vision: VisionShape, width: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(llama.cpp's name, numpy shape, role) of every tensor of a Gemma 3 mmproj file, in the
    converter's types: 'f16' matrices, 'f32' embeddings, 'ones' and 'zeros' the norms' weights
    and the biases (F32); the soft-embedding norm's ones are the 1 + w of w = 0."""
    h, ff = vision.hidden_size, vision.intermediate_size
    positions = (vision.image_size // vision.patch_size) ** 2
    out = [
        ("v.patch_embd.weight", (h, 3, vision.patch_size, vision.patch_size), "f32"),
        ("v.patch_embd.bias", (h,), "zeros"),
        ("v.position_embd.weight", (positions, h), "f32"),
    ]
    # a block's layers: (name, output width, input width); a norm's input width is None
    layers = [("ln1", h, None), ("attn_q", h, h), ("attn_k", h, h), ("attn_v", h, h)]
    layers += [("attn_out", h, h), ("ln2", h, None), ("ffn_up", ff, h), ("ffn_down", h, ff)]
    for i in range(vision.num_layers):
        for name, rows, columns in layers:
            weight = ((rows,), "ones") if columns is None else ((rows, columns), "f16")
            out += [
                (f"v.blk.{i}.{name}.weight", *weight),
                (f"v.blk.{i}.{name}.bias", (rows,), "zeros"),
            ]
    out += [("v.post_ln.weight", (h,), "ones"), ("v.post_ln.bias", (h,), "zeros")]
    out += [("mm.input_projection.weight", (h, width), "f16")]
    out += [("mm.soft_emb_norm.weight", (h,), "ones")]
    return out


def write_mmproj(path: Path, vision: VisionShape, width: int, seed: int = 0, std: float = 0.02):
    """An f16 mmproj GGUF of random weights (to a temporary name, renamed when complete)."""
    from gguf import GGUFWriter

    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    writer = GGUFWriter(str(partial), "clip")
    try:
        writer.add_type("mmproj")
        writer.add_name(f"random gemma3 siglip {vision.image_size}")
        writer.add_bool("clip.has_vision_encoder", True)
        writer.add_string("clip.projector_type", "gemma3")
        writer.add_bool("clip.use_gelu", True)
        for key, value in (
            ("projection_dim", width),
            ("image_size", vision.image_size),
            ("patch_size", vision.patch_size),
            ("embedding_length", vision.hidden_size),
            ("feed_forward_length", vision.intermediate_size),
            ("block_count", vision.num_layers),
            ("attention.head_count", vision.num_heads),
        ):
            writer.add_uint32(f"clip.vision.{key}", value)
        writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
        writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        if vision.scale != 4:  # the converter writes it only where it is not llama.cpp's default
            writer.add_uint32("clip.vision.projector.scale_factor", vision.scale)
        tensors = mmproj_tensors(vision, width)
        for name, shape, role in tensors:
            dtype = np.dtype(np.float16 if role == "f16" else np.float32)
            writer.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        rng = np.random.Generator(np.random.SFC64(seed))
        for _, shape, role in tensors:
            if role in ("ones", "zeros"):
                data = np.full(shape, 1.0 if role == "ones" else 0.0, dtype=np.float32)
            else:
                data = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
                data = data.astype(np.float16) if role == "f16" else data
            writer.write_tensor_data(data)
        writer.flush()
        writer.close()
        os.replace(partial, path)
    finally:
        writer.close()
        partial.unlink(missing_ok=True)
    return path


def ensure_pair(directory: Path, shape: PairShape, quant: str) -> tuple[Path, Path]:
    """The pair's text and mmproj files in `directory`, written where missing."""
    from localchat.bench.random_gguf import write_random_gguf

    directory.mkdir(parents=True, exist_ok=True)
    text = directory / f"random-{shape.name}-{quant}-v{FILE_VERSION}.gguf"
    mmproj = directory / f"mmproj-random-{shape.name}-f16-v{FILE_VERSION}.gguf"
    if not text.is_file():
        say(f"writing {text} ...")
        start = time.perf_counter()
        tokenizer = gemma_tokenizer(shape.vocab_size)
        write_random_gguf(text, shape.text, quant, tokenizer=tokenizer)
        say(f"  {text.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - start:.0f} s")
    if not mmproj.is_file():
        say(f"writing {mmproj} ...")
        start = time.perf_counter()
        write_mmproj(mmproj, shape.vision, shape.text.hidden_size)
        say(f"  {mmproj.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - start:.0f} s")
    return text, mmproj


def picture(index: int, size: int) -> np.ndarray:
    """Round `index`'s picture: `size` x `size` RGB, the same in every process."""
    rng = np.random.default_rng(10_000 + index)
    return rng.integers(0, 256, (size, size, 3), dtype=np.uint8)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the two systems, each in its own process ----------------------------------------------------


@dataclass
class VisionSpec(IsolatedSpec):
    """What a child loads (IsolatedSpec's `system`, `gguf_path`, `num_threads`, `n_ctx`), and the
    image encoder's file, the pictures' size and the tokens a reply."""

    mmproj: str = ""
    picture_size: int = 896
    max_tokens: int = 1

    def load(self):
        return LocalchatVision(self) if self.system == "localchat" else LlamaCppVision(self)


class LocalchatVision:
    def __init__(self, spec: VisionSpec):
        import torch

        from localchat import LLM
        from localchat.bench.big_model import kv_pool_bytes
        from localchat.config import EngineConfig
        from localchat.engine.core.runtime import pool_dtype
        from localchat.engine.sampling.sampling_params import SamplingParams
        from localchat.kernels.kv_quant import kv_row_bytes
        from localchat.server.vision_prompt import load_processor

        self.spec = spec
        config = EngineConfig.from_kwargs(
            spec.gguf_path,
            mmproj=spec.mmproj,
            num_threads=spec.num_threads,
            max_model_len=spec.n_ctx,
        )
        # a KV pool of n_ctx tokens, as llama.cpp's context (C4 does the same), and a tenth more:
        # the sliding-window and global layers' blocks come in groups of equal layer counts (34
        # layers take 7 groups of 5), so the pool holds a layer's worth it never fills
        element_size = kv_row_bytes(pool_dtype(config, "gguf"), 32) / 32
        config.kv_cache_memory = int(
            1.1 * kv_pool_bytes(Path(spec.gguf_path), spec.n_ctx, config.block_size, element_size)
        )
        self.llm = LLM(config=config)
        engine = self.llm.engine
        if not engine.model_info.takes_images:
            raise RuntimeError(f"localchat loaded {spec.gguf_path} without an image encoder")
        self.processor = load_processor(str(engine.model_info.processor_dir))
        self.image_token = self.processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
        self.tokens_per_image = int(self.processor.image_seq_length)
        rendered = engine.render_chat(MESSAGES, add_generation_prompt=True)
        self.text = engine.detokenize(rendered, skip_special_tokens=False)
        self.question_tokens = len(engine.tokenize(QUESTION, add_special_tokens=False))
        self.params = SamplingParams(temperature=0, max_tokens=spec.max_tokens, ignore_eos=True)
        self.encode_s: list[float] = []
        cache = engine.runner.encoder_cache
        encode = cache.encode

        def timed_encode(pixels):
            start = time.perf_counter()
            out = encode(pixels)
            self.encode_s.append(time.perf_counter() - start)
            return out

        cache.encode = timed_encode
        self.label = f"localchat ({Path(spec.gguf_path).name}, torch {torch.__version__})"
        self._ids = 0

    def warm_up(self) -> None:
        self.call({"picture": WARM_UP_PICTURE})

    def call(self, command: dict) -> dict:
        import torch
        from PIL import Image

        from localchat.engine.core.multimodal import images_of_prompt

        pixels_in = Image.fromarray(picture(command["picture"], self.spec.picture_size))
        engine = self.llm.engine
        self.encode_s.clear()
        self._ids += 1
        start = time.perf_counter()
        inputs = self.processor(text=self.text, images=[pixels_in], add_special_tokens=False)
        ids = [int(t) for t in inputs["input_ids"][0]]
        pixels = torch.from_numpy(np.asarray(inputs["pixel_values"]))
        images = images_of_prompt(ids, pixels, self.image_token, self.tokens_per_image)
        request = engine.add_request(f"vision-{self._ids}", ids, self.params, images=images)
        first = None
        while engine.has_unfinished():
            outputs = engine.step()
            if first is None and any(o.outputs and o.outputs[0].token_ids for o in outputs):
                first = time.perf_counter()
        end = time.perf_counter()
        assert first is not None
        reply = [int(t) for t in request.seqs[0].output_token_ids]
        return {
            "ttft_s": first - start,
            "encode_s": sum(self.encode_s),
            "total_s": end - start,
            "prompt": [None if t == self.image_token else t for t in ids],
            "question_tokens": self.question_tokens,
            "cached_tokens": request.num_cached_tokens,
            "reply": reply,
            "reply_text": engine.detokenize(reply, skip_special_tokens=False),
        }


class LlamaCppVision:
    def __init__(self, spec: VisionSpec):
        import jinja2.sandbox
        import llama_cpp
        from llama_cpp import mtmd_cpp as mtmd

        from localchat.bench.peer_llama_cpp import LlamaCppPeer

        self.spec, self.mtmd, self.llama_cpp = spec, mtmd, llama_cpp
        # llama.cpp's and mtmd's log, kept to say why a load failed
        self.log: collections.deque[str] = collections.deque(maxlen=60)
        self._log_callback = llama_cpp.llama_log_callback(
            lambda level, text, user_data: self.log.append(text.decode(errors="replace"))
        )
        llama_cpp.llama_log_set(self._log_callback, ctypes.c_void_p(0))
        mtmd.mtmd_log_set(self._log_callback, ctypes.c_void_p(0))
        mtmd.mtmd_helper_log_set(self._log_callback, ctypes.c_void_p(0))
        self.no_callback = mtmd.mtmd_helper_post_decode_callback()  # a null function pointer
        try:  # as the llama.cpp peer of `localchat bench` loads it: batches of 512 tokens
            self.llm = LlamaCppPeer(Path(spec.gguf_path), spec.num_threads, spec.n_ctx).llm
        except Exception as exc:
            raise RuntimeError(
                f"llama.cpp could not load {spec.gguf_path}: {exc}{self._tail()}"
            ) from None
        self.n_batch = self.llm.n_batch  # an image's tokens go in one batch
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = spec.num_threads
        self.ctx = mtmd.mtmd_init_from_file(spec.mmproj.encode(), self.llm.model, params)
        if not self.ctx:
            raise RuntimeError(
                f"llama.cpp's mtmd_init_from_file refused {spec.mmproj}{self._tail()}"
            )
        if not mtmd.mtmd_support_vision(self.ctx):
            raise RuntimeError(f"llama.cpp's mtmd: {spec.mmproj} has no vision encoder")
        # the template's prompt, the image marker where Gemma3Processor puts the image
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True
        )
        template = environment.from_string(self.llm.metadata["tokenizer.chat_template"])
        text = template.render(
            messages=MESSAGES, add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>"
        )
        marker = mtmd.mtmd_default_marker().decode()
        self.prompt = text.replace("<start_of_image>", f"\n\n{marker}\n\n").encode()
        self.n_vocab = self.llm.n_vocab()
        self.question_tokens = len(self.llm.tokenize(QUESTION.encode(), add_bos=False))
        self.label = f"llama.cpp mtmd (llama-cpp-python {llama_cpp.__version__})"

    def _tail(self) -> str:
        lines = [line for line in "".join(self.log).splitlines() if line.strip()][-6:]
        return ("; its log ends: " + " | ".join(lines)) if lines else ""

    def warm_up(self) -> None:
        self.call({"picture": WARM_UP_PICTURE})

    def _argmax(self) -> int:
        logits = self.llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.n_vocab,))))

    def call(self, command: dict) -> dict:
        llama_cpp, mtmd = self.llama_cpp, self.mtmd
        size = self.spec.picture_size
        pixels = np.ascontiguousarray(picture(command["picture"], size))
        lctx = self.llm.ctx
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(lctx), True)
        text = mtmd.mtmd_input_text()
        text.text, text.text_len = self.prompt, len(self.prompt)
        text.add_special, text.parse_special = False, True  # the template wrote <bos>
        encode_s = 0.0
        start = time.perf_counter()
        bitmap = mtmd.mtmd_bitmap_init(
            size, size, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        )
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            status = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if status != 0:
                raise RuntimeError(f"mtmd_tokenize failed ({status}){self._tail()}")
            n_past, count = 0, mtmd.mtmd_input_chunks_size(chunks)
            prompt: list[int | None] = []
            for i in range(count):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                new_n_past = llama_cpp.llama_pos(0)
                if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    status = mtmd.mtmd_helper_eval_chunk_single(
                        self.ctx, lctx, chunk, n_past, 0, self.n_batch, i == count - 1,
                        ctypes.byref(new_n_past),
                    )  # fmt: skip
                else:
                    if i == count - 1:
                        raise RuntimeError("the prompt ends in the image: no logits to sample")
                    encode_start = time.perf_counter()
                    status = mtmd.mtmd_encode_chunk(self.ctx, chunk)
                    encode_s += time.perf_counter() - encode_start
                    if status != 0:
                        raise RuntimeError(f"mtmd_encode_chunk failed ({status}){self._tail()}")
                    status = mtmd.mtmd_helper_decode_image_chunk(
                        self.ctx, lctx, chunk, mtmd.mtmd_get_output_embd(self.ctx), n_past, 0,
                        self.n_batch, ctypes.byref(new_n_past), self.no_callback, None,
                    )  # fmt: skip
                if status != 0:
                    raise RuntimeError(f"evaluating chunk {i} failed ({status}){self._tail()}")
                n_past = new_n_past.value
            token = self._argmax()
            first = time.perf_counter()
            for i in range(count):  # the prompt's tokens, for the comparison with localchat's
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    prompt += [int(ids[j]) for j in range(n.value)]
                else:
                    prompt += [None] * mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)
        reply = [token]
        while len(reply) < self.spec.max_tokens:
            batch = llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 1)(token), 1)
            if llama_cpp.llama_decode(lctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed{self._tail()}")
            token = self._argmax()
            reply.append(token)
        end = time.perf_counter()
        return {
            "ttft_s": first - start,
            "encode_s": encode_s,
            "total_s": end - start,
            "prompt": prompt,
            "question_tokens": self.question_tokens,
            "cached_tokens": 0,
            "reply": reply,
            "reply_text": self.llm.detokenize(reply, special=True).decode(errors="replace"),
        }


# --- the paired rounds ---------------------------------------------------------------------------


def machine() -> dict:
    from localchat.bench.host import core_round_trip_ns
    from localchat.bench.report import machine_info, versions

    return {**machine_info(), "versions": versions(), "core_round_trip_ns": core_round_trip_ns()}


def run(args: argparse.Namespace) -> dict:
    from localchat.bench.host import core_round_trip_ns
    from localchat.bench.peer_llama_cpp import INSTALL_HINT, llama_cpp_available
    from localchat.engine.loading.mmproj import read_mmproj
    from localchat.errors import LocalchatError

    if args.text and args.mmproj:
        text, mmproj = Path(args.text), Path(args.mmproj)
    else:
        from localchat.models.paths import cache_root

        tiny = "vision-ttft-tiny" if args.tiny else "vision-ttft"
        directory = args.dir or cache_root() / "bench" / tiny
        text, mmproj = ensure_pair(Path(directory), pair_shape(args.tiny), args.quant)
    notes: list[str] = []
    try:
        image_tokens = read_mmproj(mmproj).tokens_per_image
    except LocalchatError as exc:  # localchat's child says so again; llama.cpp may take it
        image_tokens = None
        notes.append(f"localchat cannot read {mmproj.name}: {exc}")
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    if "llama.cpp" in systems and not llama_cpp_available():
        systems.remove("llama.cpp")
        notes.append(f"llama.cpp skipped: llama-cpp-python is not installed ({INSTALL_HINT})")
    # the image's tokens, the template's and the question's (54 here), the reply's
    n_ctx = 256 * -(-((image_tokens or 896) + 128) // 256)
    children: dict[str, IsolatedSystem] = {}
    rounds: list[dict] = []
    figures: dict[str, dict] = {}
    try:
        for system in systems:  # loaded one after the other, then both kept loaded
            spec = VisionSpec(
                system,
                str(text),
                args.threads,
                n_ctx,
                mmproj=str(mmproj),
                picture_size=args.picture_size,
                max_tokens=args.max_tokens,
            )
            child = IsolatedSystem(spec, system, child=[str(Path(__file__).resolve()), "--child"])
            say(f"{system}: loading {text.name} and {mmproj.name} in its own process ...")
            if child.start():
                say(f"  {child.label}: loaded in {child.load_s:.1f} s, warmed up")
                children[system] = child
            else:
                notes.append(f"{system} could not run this pair: {child.error}")
                say(f"  {notes[-1]}")
                figures[system] = child.close()
        order = list(children)
        for index in range(args.rounds if children else 0):
            entry: dict = {"round": index + 1, "picture": index, "order": order[:]}
            for system in order:
                trip = core_round_trip_ns()  # where the host has put the two CPUs (host.py)
                reply = children[system].call({"picture": index})
                if reply is None:
                    entry[system] = {"error": children[system].error}
                    continue
                entry[system] = {k: v for k, v in reply.items() if k != "event"}
                entry[system]["core_round_trip_ns"] = trip
            ttft = {s: entry[s].get("ttft_s") for s in order}
            if all(ttft.get(s) for s in SYSTEMS):
                entry["ratio"] = ttft["localchat"] / ttft["llama.cpp"]
            rounds.append(entry)
            say(
                f"round {index + 1}: "
                + ", ".join(_round_text(s, entry[s]) for s in order)
                + (f"; localchat/llama.cpp {entry['ratio']:.2f}x" if "ratio" in entry else "")
            )
            order.reverse()
    finally:
        for system, child in children.items():
            figures[system] = child.close()
            figures[system]["label"] = child.label
            if child.error:
                notes.append(f"{system}: {child.error}")
    return summarize(args, text, mmproj, image_tokens, systems, rounds, figures, notes)


def _round_text(system: str, result: dict) -> str:
    if "error" in result:
        return f"{system} failed ({result['error']})"
    return (
        f"{system} TTFT {result['ttft_s'] * 1e3:,.0f} ms (encoder {result['encode_s'] * 1e3:,.0f}"
        f" ms, reply {result['reply']})"
    )


def _median_ms(rounds: list[dict], system: str, key: str) -> float | None:
    values = [r[system][key] for r in rounds if key in r.get(system, {})]
    return statistics.median(values) * 1e3 if values else None


def summarize(args, text, mmproj, image_tokens, systems, rounds, figures, notes) -> dict:
    # each round's prompt of each system (image tokens as None), kept once
    prompts = [{s: r[s].pop("prompt", None) for s in systems if s in r} for r in rounds]
    ours = [p.get("localchat") for p in prompts]
    identical = bool(rounds) and all(
        p.get("localchat") is not None and p.get("localchat") == p.get("llama.cpp") for p in prompts
    )
    per_system = {}
    for system in systems:
        ok = [r[system] for r in rounds if "ttft_s" in r.get(system, {})]
        per_system[system] = {
            **figures.get(system, {}),
            "ttft_ms": [r["ttft_s"] * 1e3 for r in ok],
            "encode_ms": [r["encode_s"] * 1e3 for r in ok],
            "median_ttft_ms": _median_ms(rounds, system, "ttft_s"),
            "median_encode_ms": _median_ms(rounds, system, "encode_s"),
            "prompt_tokens": next((len(p[system]) for p in prompts if p.get(system)), None),
            "question_tokens": ok[0]["question_tokens"] if ok else None,
            "replies": [r["reply"] for r in ok],
        }
    ratios = [r["ratio"] for r in rounds if "ratio" in r]
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "benchmarks/vision_ttft.py", *args.argv]),
        "machine": machine(),
        "threads": args.threads,
        "files": {
            "text": {"path": str(text), "bytes": text.stat().st_size},
            "mmproj": {"path": str(mmproj), "bytes": mmproj.stat().st_size},
        },
        "picture_size": args.picture_size,
        "image_tokens": image_tokens,
        "question": QUESTION,
        "max_tokens": args.max_tokens,
        "prompts_identical": identical,
        "prompt": next((p for p in ours if p is not None), None),
        "results": per_system,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "notes": notes,
        "rounds": rounds,
    }


def print_summary(summary: dict) -> None:
    print(f"command: {summary['command']}")
    print(f"date: {summary['date']}")
    m = summary["machine"]
    print(f"machine: {m.get('cpu')}, {m.get('cpu_count')} CPUs, {m.get('memory_gib')} GiB")
    print(f"threads: {summary['threads']}")
    print(f"pair: {summary['files']['text']['path']} + {summary['files']['mmproj']['path']}")
    for system, fig in summary["results"].items():
        if not fig["ttft_ms"]:
            print(f"{system}: no round ran (see the notes)")
            continue
        ttft = ", ".join(f"{v:,.0f}" for v in fig["ttft_ms"])
        encode = ", ".join(f"{v:,.0f}" for v in fig["encode_ms"])
        print(
            f"{system}: TTFT {ttft} ms (median {fig['median_ttft_ms'] or float('nan'):,.0f}); "
            f"encoder {encode} ms; prompt {fig['prompt_tokens']} tokens (question "
            f"{fig['question_tokens']}); "
            f"load {fig.get('load_s') or float('nan'):.1f} s, "
            f"peak RSS {fig.get('peak_rss_mib') or float('nan'):,.0f} MiB"
        )
    print(f"prompts identical: {summary['prompts_identical']}")
    if summary["median_ratio"] is not None:
        rounds = ", ".join(f"{r:.2f}" for r in summary["ratios"])
        print(f"TTFT localchat / llama.cpp: median {summary['median_ratio']:.2f}x ({rounds})")
    for note in summary["notes"]:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one system's process (localchat.bench.isolated)
        from localchat.bench.isolated_child import main as child_main

        return child_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=2, choices=range(1, 5))
    parser.add_argument("--quant", default="q4_k_m", choices=["q4_k_m", "q4_0"])
    parser.add_argument("--text", help="the text model's GGUF (with --mmproj)")
    parser.add_argument("--mmproj", help="its mmproj GGUF (with --text)")
    parser.add_argument("--dir", type=Path, help="where the pair is written and kept")
    parser.add_argument("--tiny", action="store_true", help="a small pair, for a check")
    parser.add_argument("--picture-size", type=int, default=896)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    args.argv = argv
    if bool(args.text) != bool(args.mmproj):
        parser.error("--text and --mmproj go together")
    summary = run(args)
    print_summary(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
