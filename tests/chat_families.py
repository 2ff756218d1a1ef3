"""The chat formats of the model families we run, built here without a model hub: a tokenizer with
each family's special tokens, a chat template in its documented format (tests/data/templates/
families, written for the tests), the family's end-of-turn tokens, and "bigram" models of the
family's architecture whose greedy reply is a chain of tokens the test chooses.

The tokenizer is byte-level BPE: the 256 byte symbols (so any text encodes, one byte a token), a
few whole words the chains use (added tokens: text that holds them encodes to them), then the
special tokens. A bigram model is the family's tiny transformers model (tests/family_models.py)
with every weight zero except a one-hot embedding, an identity final norm and a head that scores
token b after token a: each layer adds nothing to the residual stream, so the logits depend on the
last token only, exactly. `chain` scores TOP the next token of a chain; `branch` scores ALT an
alternative that a request's `logit_bias` of STEER picks instead (whatever the family's logit
scaling or capping).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

TEMPLATES = Path(__file__).parent / "data" / "templates" / "families"
TOP, ALT, STEER = 4.0, 3.5, 1.0


@dataclass(frozen=True)
class ChatFormat:
    template: str  # file name under TEMPLATES
    specials: tuple[str, ...]
    eos: str  # the tokenizer's (and config.json's) EOS token
    end_of_turn: tuple[str, ...]  # generation_config.json's eos_token_id, in order
    bos: str | None = None


_HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>")
_GEMMA = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>")
_PHI = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
_QWEN = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _gemma(template: str) -> ChatFormat:
    return ChatFormat(template, _GEMMA, "<eos>", ("<eos>", "<end_of_turn>"), bos="<bos>")


def _phi(template: str) -> ChatFormat:
    return ChatFormat(template, _PHI, "<|endoftext|>", ("<|end|>", "<|endoftext|>"))


FORMATS: dict[str, ChatFormat] = {
    "gemma2": _gemma("gemma.jinja"),
    "gemma3": _gemma("gemma3.jinja"),
    "phi3": _phi("phi3.jinja"),
    "phi4-mini": _phi("phi4_mini.jinja"),
    "olmo2": ChatFormat(
        "tulu.jinja",
        ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>"),
        "<|endoftext|>",
        ("<|endoftext|>",),
        bos="<|endoftext|>",
    ),
    "olmoe": ChatFormat(
        "tulu.jinja",
        ("<|endoftext|>", "<|padding|>", "<|system|>", "<|user|>", "<|assistant|>"),
        "<|endoftext|>",
        ("<|endoftext|>",),
    ),
    "granite": ChatFormat(
        "granite.jinja",
        ("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"),
        "<|end_of_text|>",
        ("<|end_of_text|>",),
    ),
    "smollm3": ChatFormat(
        "chatml.jinja",
        ("<|im_start|>", "<|im_end|>", "<|end_of_text|>"),
        "<|im_end|>",
        ("<|im_end|>",),
    ),
    "qwen2-moe": ChatFormat("chatml.jinja", _QWEN, "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
    "qwen3-moe": ChatFormat("chatml.jinja", _QWEN, "<|im_end|>", ("<|im_end|>", "<|endoftext|>")),
    "mixtral": ChatFormat("mistral_v1.jinja", ("<unk>", "<s>", "</s>"), "</s>", ("</s>",), "<s>"),
    "gpt-oss": ChatFormat(
        "harmony.jinja",
        ("<|endoftext|>", *_HARMONY, "<|return|>", "<|call|>"),
        "<|return|>",
        ("<|return|>", "<|endoftext|>", "<|call|>"),
    ),
}


def template_source(family: str) -> str:
    return (TEMPLATES / FORMATS[family].template).read_text()


def tokenizer(family: str, words: tuple[str, ...] = ()):
    """The family's test tokenizer (a transformers fast tokenizer) with its chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chat = FORMATS[family]
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # the words are added tokens, so that text holding them encodes to them (as a grammar's
    # forced text is encoded)
    backend.add_tokens([AddedToken(w, special=False, normalized=False) for w in words])
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in chat.specials]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=chat.eos,
        bos_token=chat.bos,
        pad_token=chat.specials[0],
        chat_template=template_source(family),
    )


def token(tokenizer, text: str) -> int:
    """The id of one token, given as its text (a word of the vocabulary or a special token)."""
    found = tokenizer.get_added_vocab().get(text)
    if found is None:
        found = tokenizer.convert_tokens_to_ids(text.replace(" ", "Ġ").replace("\n", "Ċ"))
    assert found is not None and found != tokenizer.unk_token_id, text
    return found


def save_bigram(
    family: str,
    tokenizer,
    directory: Path,
    chain: list[tuple[int, int]],
    branch: list[tuple[int, int]] | None = None,
) -> Path:
    """Save the family's bigram model (see the module's docstring), its tokenizer, and its token
    ids and end-of-turn tokens in config.json and generation_config.json."""
    import transformers

    from tests.family_models import _BASE, FAMILIES

    config_class, model_class, overrides = FAMILIES[family]
    size = -(-len(tokenizer) // 64) * 64  # the embedding is one-hot: as wide as the vocabulary
    chat = FORMATS[family]
    ids = {
        "vocab_size": size,
        "hidden_size": size,
        "num_attention_heads": size // 16,  # heads of 16, as the family's tiny model has
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "eos_token_id": token(tokenizer, chat.eos),
        "bos_token_id": token(tokenizer, chat.bos) if chat.bos else None,
        "pad_token_id": token(tokenizer, chat.specials[0]),
    }
    config = getattr(transformers, config_class)(**{**_BASE, **overrides, **ids})
    model = getattr(transformers, model_class)(config).to(torch.float32).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.get_input_embeddings().weight.copy_(torch.eye(size))
        # RMSNorm scales a one-hot row by sqrt(size); Gemma's norm multiplies by (1 + weight)
        model.model.norm.weight.fill_(0.0 if family.startswith("gemma") else 1.0)
        head = model.get_output_embeddings().weight
        for scores, edges in ((TOP, chain), (ALT, branch or [])):
            for a, b in edges:
                head[b, a] = scores / size**0.5
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    generation = {"eos_token_id": [token(tokenizer, t) for t in chat.end_of_turn]}
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def pairs(tokens: list[int]) -> list[tuple[int, int]]:
    """A chain's (token, next token) pairs."""
    return list(itertools.pairwise(tokens))


HARMONY_WORDS = (
    "assistant",
    "analysis",
    "final",
    "commentary",
    " to=functions.get_weather ",
    "json",
    " hmm",
    '{"ok":',
    "true",
    '{"city":"',
    "Paris",
    '"}',
    "LEAK",
)


def save_harmony_bigram(directory: Path) -> Path:
    """A gpt-oss bigram model that writes harmony. Unsteered, after the generation prompt
    (`<|start|>assistant`) it thinks " hmm" in messages on the analysis channel, one after another.
    Steered by a request's logit_bias (STEER on a token), or where a grammar rules the usual token
    out, it takes a branch: after <|channel|>, `final` or `commentary to=functions.get_weather
    <|constrain|>json`; after <|message|>, `{"ok":true}` (then <|return|>) or `{"city":"Paris"}`
    (then <|call|>); after " hmm", <|return|>. After either stop token: "LEAK"."""
    tok = tokenizer("gpt-oss", HARMONY_WORDS)
    t = {word: token(tok, word) for word in (*HARMONY_WORDS, *FORMATS["gpt-oss"].specials, "}")}
    hello = [{"role": "user", "content": "Hi"}]
    prompt = tok.apply_chat_template(hello, tokenize=False, add_generation_prompt=True)
    assert tok.encode(prompt, add_special_tokens=False)[-1] == t["assistant"]
    chain = [
        *pairs([t[w] for w in ("<|channel|>", "analysis", "<|message|>", " hmm", "<|end|>")]),
        *pairs([t[w] for w in ("<|end|>", "<|start|>", "assistant", "<|channel|>")]),
        (t["final"], t["<|message|>"]),
        *pairs([t[w] for w in ("commentary", " to=functions.get_weather ", "<|constrain|>")]),
        *pairs([t[w] for w in ("<|constrain|>", "json", "<|message|>")]),
        *pairs([t[w] for w in ('{"ok":', "true", "}", "<|return|>", "LEAK", "LEAK")]),
        *pairs([t[w] for w in ('{"city":"', "Paris", '"}', "<|call|>", "LEAK")]),
    ]
    branch = [
        (t["<|channel|>"], t["final"]),
        (t["<|channel|>"], t["commentary"]),
        (t["<|message|>"], t['{"ok":']),
        (t["<|message|>"], t['{"city":"']),
        (t[" hmm"], t["<|return|>"]),
    ]
    return save_bigram("gpt-oss", tok, directory, chain, branch)
