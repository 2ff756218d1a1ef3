"""Incremental detokenization: deltas add up to the final text; stop strings are cut and never
leak."""

from __future__ import annotations

import pytest

from localchat.engine.sampling.detokenizer import IncrementalDetokenizer
from localchat.engine.sampling.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def tokenizer(llm):
    return llm.tokenizer


def stream(tokenizer, text, **params):
    """Feed `text`'s tokens one by one; return (deltas, stop string found, final text)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Say:"), SamplingParams(**params))
    deltas, stop = [], None
    for token in ids:
        stop = detok.add_token(token)
        deltas.append(detok.take_delta(finished=stop is not None))
        if stop:
            break
    else:
        deltas.append(detok.take_delta(finished=True))
    return deltas, stop, detok.text


def test_deltas_concatenate_to_the_text_without_replacement_characters(tokenizer):
    text = "Grüße aus Köln! 你好，世界 😀🎉 naïve café — fin."  # noqa: RUF001 - CJK comma on purpose
    deltas, _, final = stream(tokenizer, text)
    assert "".join(deltas) == final == text
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_across_token_boundaries_is_cut(tokenizer):
    deltas, stop, final = stream(tokenizer, "alpha beta STOPWORD gamma", stop=["STOPWORD"])
    assert stop == "STOPWORD"
    assert final == "alpha beta " and "".join(deltas) == final


def test_partial_stop_string_is_held_back_until_ruled_out(tokenizer):
    ids = tokenizer.encode("one ST two STOP three", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["STOP"]))
    streamed = ""
    for token in ids:
        if detok.add_token(token):
            break
        streamed += detok.take_delta(False)
        assert not detok.text.endswith("ST") or not streamed.endswith("ST")
    assert detok.text == "one ST two " and streamed + detok.take_delta(True) == "one ST two "


def test_include_stop_str_in_output(tokenizer):
    _, stop, final = stream(tokenizer, "a b END c", stop=["END"], include_stop_str_in_output=True)
    assert stop == "END" and final == "a b END"


def test_earliest_of_several_stop_strings_wins(tokenizer):
    _, stop, final = stream(tokenizer, "x y z w", stop=["w", "y z"])
    assert stop == "y z" and final == "x "


def _byte_fallback_tokenizer():
    """A SentencePiece-style BPE with byte fallback and Llama's decoder (Replace, ByteFallback,
    Fuse, Strip), as transformers builds Llama 2's, Gemma's and Phi-3's from a GGUF."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0} | {f"<0x{b:02X}>": 1 + b for b in range(256)}
    vocab |= {"&": 257, "▁b": 258, "ver": 259}
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_a_byte_run_that_is_not_utf8_does_not_fail_the_stream():
    """Sampled byte tokens 'w', 0x82, '}', 'C' then '&': the run is not UTF-8, so its decode turns
    'w' (streamed already) into a replacement character and tokenizers' DecodeStream raises; the
    detokenizer starts its stream again and goes on."""
    from tokenizers.decoders import DecodeStream

    tokenizer = _byte_fallback_tokenizer()
    ids = [1 + 0x77, 1 + 0x82, 1 + 0x7D, 1 + 0x43, 257, 258, 259]
    raw = DecodeStream(skip_special_tokens=True)
    with pytest.raises(Exception, match="Invalid prefix"):
        for token in ids:
            raw.step(tokenizer._tokenizer, token)
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["zz"]))
    deltas = []
    for token in ids:
        assert detok.add_token(token) is None
        deltas.append(detok.take_delta(finished=False))
    deltas.append(detok.take_delta(finished=True))
    assert "".join(deltas) == detok.text
    assert detok.text.startswith("w") and detok.text.endswith("& bver")
