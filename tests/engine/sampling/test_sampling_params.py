"""SamplingParams validation names the field and its range."""

import pytest

from localchat.engine.sampling.sampling_params import SamplingParams
from localchat.errors import InvalidParameterError


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("n", 0),
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("logprobs", 21),
        ("seed", 2**64),
        ("stop", [""]),
        ("stop_token_ids", [-1]),
    ],
)
def test_out_of_range_values_name_the_field(field, value):
    with pytest.raises(InvalidParameterError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field and field in info.value.message


def test_min_tokens_above_max_tokens():
    with pytest.raises(InvalidParameterError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]
