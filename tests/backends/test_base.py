import pytest

from backends.base import STOP_TOKEN_IDS, SamplingParams


def test_defaults_match_mlperf_generation_settings():
    p = SamplingParams(max_new_tokens=10240)
    assert (p.temperature, p.top_p, p.top_k) == (1.0, 1.0, 0)
    assert p.stop_token_ids == STOP_TOKEN_IDS == (200002, 200012, 199999)
    assert not p.greedy


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
        ({"max_new_tokens": 4, "temperature": -1.0}, "temperature must be >= 0, got -1.0"),
        ({"max_new_tokens": 4, "top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"max_new_tokens": 4, "top_k": -1}, "top_k must be >= 0 (0 disables it), got -1"),
    ],
)
def test_bad_sampling_params_are_refused(kwargs, message):
    with pytest.raises(ValueError) as e:
        SamplingParams(**kwargs)
    assert str(e.value) == message
