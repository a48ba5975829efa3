"""Decoding mlperf_log_accuracy.json: hex round trip, real LoadGen logs, the Server first-token check."""

import json

import pytest

from evaluation.accuracy_log import AccuracyLogError, decode_tokens, encode_tokens, load_accuracy_log
from tests.evaluation.evalkit import run_loadgen, write_log


def test_hex_is_upper_case_little_endian_int32_and_round_trips():
    tokens = [0, 1, 255, 256, 200002, 201087, 2**31 - 1, -1]
    hex_data = encode_tokens(tokens)
    assert hex_data == ("0000000001000000FF00000000010000420D03007F110300FFFFFF7FFFFFFFFF")
    assert decode_tokens(hex_data) == tuple(tokens)
    assert decode_tokens(hex_data.lower()) == tuple(tokens)
    assert decode_tokens("") == ()


def test_hex_that_is_not_whole_int32s_is_an_error():
    with pytest.raises(ValueError, match="6 bytes is not a whole number of int32 tokens"):
        decode_tokens("000000000000")
    with pytest.raises(ValueError):
        decode_tokens("0G000000")


@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_real_loadgen_log_decodes_to_the_sut_outputs(tmp_path, scenario):
    outputs = [[200005, 17196, 200008, 100 + i, 200002] for i in range(4)] + [[7, 8]]
    log = run_loadgen(tmp_path, outputs, scenario)
    raw = json.loads(log.read_text())
    assert len(raw) == 5
    assert ("token_data" in raw[0]) == (scenario == "server")
    entries = load_accuracy_log(log)
    assert sorted(e.qsl_idx for e in entries) == [0, 1, 2, 3, 4]
    for e in entries:
        assert e.tokens == tuple(outputs[e.qsl_idx])


def test_server_log_with_first_token_missing_from_data_is_rejected(tmp_path):
    # The MLPerf reference SUT's off-by-one: final response = tokens[1:], n = len - 1.
    good = [[5, 6, 7], [8, 9]]
    path = tmp_path / "log.json"
    entries = [
        {
            "seq_id": i,
            "qsl_idx": i,
            "data": encode_tokens(t[1:]),
            "token_data": encode_tokens(t[:1]),
            "token_count": len(t) - 1,
        }
        for i, t in enumerate(good)
    ]
    path.write_text(json.dumps(entries))
    with pytest.raises(AccuracyLogError) as err:
        load_accuracy_log(path)
    message = str(err.value)
    assert "2 of 2 entries are inconsistent" in message
    assert "entry 0 (qsl_idx 0): first token 5 (token_data) is not the first token of data (6)" in message


def test_token_count_must_match_data(tmp_path):
    path = tmp_path / "log.json"
    path.write_text(
        json.dumps([{"seq_id": 0, "qsl_idx": 3, "data": encode_tokens([1, 2, 3]), "token_count": 2}])
    )
    with pytest.raises(AccuracyLogError, match=r"qsl_idx 3\): token_count 2 but data holds 3 tokens"):
        load_accuracy_log(path)


def test_token_data_must_be_exactly_one_token(tmp_path):
    path = tmp_path / "log.json"
    path.write_text(
        json.dumps(
            [
                {
                    "seq_id": 0,
                    "qsl_idx": 0,
                    "data": encode_tokens([1, 2]),
                    "token_data": encode_tokens([1, 2]),
                    "token_count": 2,
                }
            ]
        )
    )
    with pytest.raises(AccuracyLogError, match="token_data holds 2 tokens"):
        load_accuracy_log(path)


def test_server_query_that_failed_before_its_first_token_loads_empty(tmp_path):
    """The SUT completes such a query with an empty first token and no output; the log stays usable."""
    path = tmp_path / "log.json"
    entry = {"seq_id": 0, "qsl_idx": 4, "data": "", "token_data": "", "token_count": 0}
    path.write_text(json.dumps([entry]))
    assert [(e.qsl_idx, e.tokens) for e in load_accuracy_log(path)] == [(4, ())]


def test_empty_first_token_with_output_is_refused(tmp_path):
    path = tmp_path / "log.json"
    entry = {"seq_id": 0, "qsl_idx": 4, "data": encode_tokens([7]), "token_data": "", "token_count": 1}
    path.write_text(json.dumps([entry]))
    with pytest.raises(AccuracyLogError, match="token_data holds 0 tokens"):
        load_accuracy_log(path)


def test_consistent_server_log_loads(tmp_path):
    path = write_log(tmp_path / "log.json", [[5, 6, 7], [8]], server=True, order=[1, 0])
    entries = load_accuracy_log(path)
    assert [(e.seq_id, e.qsl_idx, e.tokens) for e in entries] == [(0, 1, (8,)), (1, 0, (5, 6, 7))]


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "not valid JSON"),
        ('[{"seq_id": 0, "qsl_idx": 0, "data": "0100', "not valid JSON"),
        ('{"seq_id": 0}', "expected a JSON array"),
        ('[{"seq_id": 0, "data": "01000000"}]', "missing qsl_idx"),
        ('[{"seq_id": 0, "qsl_idx": -1, "data": "01000000"}]', "qsl_idx must be a non-negative integer"),
        ('[{"seq_id": 0, "qsl_idx": 0, "data": "010000"}]', "3 bytes is not a whole number"),
    ],
)
def test_malformed_logs_give_clear_errors(tmp_path, content, message):
    path = tmp_path / "log.json"
    path.write_text(content)
    with pytest.raises(AccuracyLogError, match=message):
        load_accuracy_log(path)


def test_missing_log_file(tmp_path):
    with pytest.raises(AccuracyLogError, match="no such accuracy log"):
        load_accuracy_log(tmp_path / "nope.json")
