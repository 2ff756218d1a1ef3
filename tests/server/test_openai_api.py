"""The openai package against a real server: structure and token accounting of chat and
completions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import MAX_MODEL_LEN

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"  # the default model
MESSAGES = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"temperature": 0, "max_tokens": 8}


def _stream_chat(client, **kwargs):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
    )
    return chunks


def test_chat_non_streamed(openai_client):
    response = openai_client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert response.model == MODEL
    [choice] = response.choices
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.prompt_tokens > 5 and 1 <= usage.completion_tokens <= 8
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_streamed_equals_non_streamed(openai_client):
    whole = openai_client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    chunks = _stream_chat(openai_client, **GREEDY)
    content_chunks = [c for c in chunks if c.choices]
    assert content_chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in content_chunks[1:])
    finishes = [c.choices[0].finish_reason for c in content_chunks if c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert content_chunks[-1].choices[0].finish_reason is not None
    assert (
        "".join(c.choices[0].delta.content or "" for c in content_chunks)
        == whole.choices[0].message.content
    )
    assert all(c.usage is None for c in content_chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    # the same prompt again: its full blocks come from the prefix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 16


def test_completions_streamed_equals_non_streamed(openai_client):
    kwargs = {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 8}
    whole = openai_client.completions.create(model=MODEL, **kwargs)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(
        openai_client.completions.create(
            model=MODEL, stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [whole.choices[0].finish_reason]
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )


def test_n2_chat_and_completions(openai_client):
    response = openai_client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=2,
        temperature=0.8,
        seed=7,
        max_tokens=5,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in response.choices) == [0, 1]
    assert all(c.finish_reason == "length" for c in response.choices)
    assert response.usage.completion_tokens == 10
    chunks = _stream_chat(
        openai_client, n=2, temperature=0.8, seed=7, max_tokens=5, extra_body={"ignore_eos": True}
    )
    texts, roles, finishes = {0: "", 1: ""}, {0: 0, 1: 0}, {0: 0, 1: 0}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            roles[choice.index] += choice.delta.role is not None
            finishes[choice.index] += choice.finish_reason is not None
    assert roles == {0: 1, 1: 1} and finishes == {0: 1, 1: 1}
    assert texts == {
        c.index: c.message.content for c in response.choices
    }  # seeded: the same samples
    assert chunks[-1].usage.completion_tokens == 10
    completion = openai_client.completions.create(
        model=MODEL,
        prompt="Once upon a time",
        n=2,
        max_tokens=4,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    assert (
        sorted(c.index for c in completion.choices) == [0, 1]
        and completion.usage.completion_tokens == 8
    )


def test_stop_strings(openai_client):
    kwargs = {"prompt": "1, 2, 3, 4, 5,", "temperature": 0, "max_tokens": 12}
    free = openai_client.completions.create(model=MODEL, **kwargs).choices[0].text
    assert " 7" in free, free
    stopped = openai_client.completions.create(model=MODEL, stop=[" 7"], **kwargs).choices[0]
    assert stopped.text == free[: free.index(" 7")]
    assert stopped.finish_reason == "stop" and stopped.model_extra["stop_reason"] == " 7"
    included = openai_client.completions.create(
        model=MODEL, stop=" 7", extra_body={"include_stop_str_in_output": True}, **kwargs
    ).choices[0]
    assert included.text == free[: free.index(" 7") + 2]
    chunks = list(openai_client.completions.create(model=MODEL, stop=[" 7"], stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == stopped.text


def test_chat_logprobs(openai_client):
    response = openai_client.chat.completions.create(
        model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=3, **GREEDY
    )
    choice = response.choices[0]
    content = choice.logprobs.content
    assert len(content) == response.usage.completion_tokens
    # the end-of-turn token has its logprob too, and no text
    assert (
        "".join(entry.token for entry in content).removesuffix("<|im_end|>")
        == choice.message.content
    )
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.bytes == list(entry.token.encode())
        # greedy
        assert entry.logprob == pytest.approx(max(t.logprob for t in entry.top_logprobs), abs=1e-4)
    chunks = _stream_chat(openai_client, logprobs=True, top_logprobs=1, **GREEDY)
    streamed = [
        e.token
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert streamed == [entry.token for entry in content]


def test_completion_logprobs(openai_client):
    response = openai_client.completions.create(
        model=MODEL, prompt="The sky is", logprobs=2, temperature=0, max_tokens=6
    )
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert token in top and 1 <= len(top) <= 3 and logprob <= 0


def test_echo_and_token_prompts(openai_client, http):
    ids = http.post("/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    response = openai_client.completions.create(
        model=MODEL, prompt=ids, echo=True, max_tokens=3, temperature=0
    )
    assert response.choices[0].text.startswith("Hello world")
    assert response.usage.prompt_tokens == len(ids)
    batch = openai_client.completions.create(
        model=MODEL,
        prompt=["Hi", "Bye"],
        max_tokens=2,
        temperature=0,
        n=2,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]  # prompt position * n + sample
    assert batch.usage.completion_tokens == 8
    single = [
        openai_client.completions.create(
            model=MODEL, prompt=p, max_tokens=2, temperature=0
        ).usage.prompt_tokens
        for p in ("Hi", "Bye")
    ]
    assert batch.usage.prompt_tokens == sum(single)


@pytest.mark.parametrize(("top", "max_tokens"), [(0, 3), (2, 3), (2, 1)])
def test_echo_with_logprobs_scores_the_prompt(openai_client, http, llm, top, max_tokens):
    """OpenAI's legacy `echo` + `logprobs`: the prompt's tokens come first, the first without a
    logprob, each scored as log_softmax of the model's own logits at the position before it. With
    max_tokens=1 too: lm-evaluation-harness scores prompts so."""
    prompt = "The capital of France is Paris, and the capital of Italy is"
    ids = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
    reference = llm.engine.prompt_logits(ids).log_softmax(dim=-1)
    response = openai_client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=top, max_tokens=max_tokens, temperature=0
    )
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert choice.text.startswith(prompt) and "".join(logprobs.tokens) == choice.text
    assert len(logprobs.tokens) == len(ids) + response.usage.completion_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for position in range(1, len(ids)):
        expected = reference[position - 1, ids[position]].item()
        assert logprobs.token_logprobs[position] == pytest.approx(expected, abs=1e-3)
        # the chosen token, if not among the top
        assert len(logprobs.top_logprobs[position]) in (top, top + 1)
    assert logprobs.text_offset == [
        sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))
    ]
    streamed = list(
        openai_client.completions.create(
            model=MODEL,
            prompt=prompt,
            echo=True,
            logprobs=top,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
    )
    tokens = [
        t
        for chunk in streamed
        if chunk.choices[0].logprobs
        for t in chunk.choices[0].logprobs.tokens
    ]
    first = streamed[0].choices[0].logprobs
    assert (
        tokens == logprobs.tokens
        and first.token_logprobs[: len(ids)] == logprobs.token_logprobs[: len(ids)]
    )


def test_server_greedy_output_equals_the_offline_llm(openai_client):
    """The same prompts through the server and through `LLM` in a process with the server's thread
    count (float sums, and so near-tied greedy picks, depend on it), each prompt new to the server's
    prefix cache (a cached prefix changes how attention is computed): the replies are the same,
    token for token."""
    # a system message of its own: the default one's first block is in the server's cache from other
    # tests
    messages = [
        {"role": "system", "content": "You answer as a marine biologist would."},
        {"role": "user", "content": "Name three animals that live in the sea."},
    ]
    prompt = "A short recipe for pancakes:"
    script = f"""
import json
from localchat import LLM, SamplingParams
llm = LLM(num_threads=1, max_model_len={MAX_MODEL_LEN})
params = SamplingParams(temperature=0, max_tokens=24)
chat, completion = llm.chat({messages!r}, params)[0], llm.generate({prompt!r}, params)[0]
print(json.dumps([chat.text, len(chat.token_ids), completion.text]))
"""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    chat_text, chat_tokens, completion_text = json.loads(run.stdout.splitlines()[-1])
    chat = openai_client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=24
    )
    assert (
        chat.choices[0].message.content == chat_text and chat.usage.completion_tokens == chat_tokens
    )
    assert chat.usage.prompt_tokens_details.cached_tokens == 0
    completion = openai_client.completions.create(
        model=MODEL, prompt=prompt, temperature=0, max_tokens=24
    )
    assert completion.choices[0].text == completion_text
