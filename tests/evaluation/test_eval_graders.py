"""Answer extraction on hand-written gpt-oss outputs: right, wrong and malformed."""

import pytest

from evaluation.graders import (
    GroundTruthError,
    extract_aime,
    extract_code,
    extract_gpqa,
    family,
    grade_aime,
    grade_gpqa,
)
from evaluation.harmony import Output, final_channel, tokenize
from tests.evaluation.evalkit import harmony


def out(final, analysis="Let me think.", end="<|return|>"):
    return Output(harmony(final, analysis, end))


def test_final_channel_is_found_at_token_level():
    tokens = harmony("The answer is 7.")
    assert Output(tokens).final == "The answer is 7."
    assert Output(harmony(None)).final is None  # truncated inside the analysis


@pytest.mark.parametrize(
    "text, final",
    [
        ("<|channel|>final<|message|>A<|return|>", "A"),
        ("<|channel|>final<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>B<|return|>", "A"),
        ("<|channel|>final <|constrain|>json<|message|>{}<|call|>", "{}"),
        ("<|channel|>final 明<|message|>corrupted header<|return|>", "corrupted header"),
        ("<|channel|>final<|message|>cut off at max tokens", "cut off at max tokens"),
        ("<|channel|>analysis<|message|>final answer soon<|end|>", None),
        ("<|channel|>commentary to=functions.x<|message|>{}<|call|>", None),
        ("no harmony markup at all", None),
    ],
)
def test_final_channel_variants(text, final):
    assert Output(tokenize(text)).final == final


def test_answer_text_falls_back_to_the_whole_output_without_a_final_channel():
    o = out(None, analysis="so \\boxed{12}")
    assert o.answer_text == "<|channel|>analysis<|message|>so \\boxed{12}<|end|>"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("So the answer is \\boxed{204}.", 204),
        ("\\boxed{ 42 }", 42),
        ("\\boxed{042}", 42),
        ("first \\boxed{1} then \\boxed{2}", 2),
        ("\\boxed{1000}", None),  # out of AIME's range
        ("\\boxed{1000} but Answer: 5", None),  # the last boxed wins even when out of range
        ("Answer: 17", 17),
        ("answer:   3\nAnswer: 999", 999),
        ("Answer: 12.5", None),  # a decimal is not an AIME answer
        ("\\boxed{x+1}", None),
        ("no answer here", None),
    ],
)
def test_extract_aime(text, expected):
    assert extract_aime(text) == expected


def test_grade_aime_uses_the_final_channel():
    assert grade_aime(out("Thus \\boxed{70}."), "70").correct
    wrong = grade_aime(out("Thus \\boxed{71}.", analysis="maybe \\boxed{70}"), "70")
    assert (wrong.correct, wrong.extracted, wrong.detail) == (False, "71", "expected 70")
    missing = grade_aime(out("I could not solve it."), "70")
    assert (missing.correct, missing.extracted) == (False, None)
    truncated = grade_aime(out(None, analysis="it is \\boxed{70}"), "70")  # reference: whole text
    assert truncated.correct
    with pytest.raises(GroundTruthError, match="must be an integer"):
        grade_aime(out("\\boxed{1}"), "seventy")


@pytest.mark.parametrize(
    "final, expected",
    [
        ("C", "C"),
        ("**B**", "B"),
        ("(D) because ...", "D"),
        ("['A']", "A"),
        ("The correct choice: Answer: B", "B"),
        ("ANSWER. c", "C"),
        ("a", "A"),  # lower case at the start, as the reference accepts
        ("Energy is conserved, so none.", None),
        ("E", None),
    ],
)
def test_extract_gpqa_from_the_final_channel(final, expected):
    assert extract_gpqa(out(final)) == expected


def test_gpqa_falls_back_to_final_answer_anywhere():
    assert extract_gpqa(out(None, analysis="FINAL ANSWER: (C) is right")) == "C"
    assert extract_gpqa(out("Energy is conserved.", analysis="Answer: B")) == "B"


def test_grade_gpqa():
    assert grade_gpqa(out("**A**"), "A").correct
    g = grade_gpqa(out("B"), "a")
    assert (g.correct, g.extracted, g.detail) == (False, "B", "expected A")
    assert grade_gpqa(out("Energy is conserved."), "A").extracted is None
    with pytest.raises(GroundTruthError, match="one of A-D"):
        grade_gpqa(out("A"), "E")


def test_extract_code():
    two_blocks = "First:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```"
    assert extract_code(out(two_blocks)) == "print(2)"
    assert extract_code(out("```py\nprint(3)\n```")) == "print(3)"
    assert extract_code(out("```\nprint(4)\n```")) == "print(4)"
    assert extract_code(out("no code, sorry")) is None
    # The final channel wins over code drafted in the analysis.
    assert extract_code(out("```python\nfinal()\n```", analysis="```python\ndraft()\n```")) == "final()"
    # Without a final channel (or code in it), the whole output is searched.
    assert extract_code(out(None, analysis="```python\ndraft()\n```")) == "draft()"
    assert extract_code(out("see above", analysis="```python\ndraft()\n```")) == "draft()"
    assert extract_code(out("```python\nunterminated")) is None


def test_family_by_name():
    assert [family(n) for n in ("aime25", "gpqa_diamond", "livecodebench_v6", "AIME24")] == [
        "aime",
        "gpqa",
        "livecodebench",
        "aime",
    ]
    with pytest.raises(GroundTruthError, match="no grader for dataset 'mmlu'"):
        family("mmlu")


def test_final_channel_tokens_are_the_content_only():
    tokens = tokenize("<|channel|>final<|message|>Hi<|return|>")
    assert final_channel(tokens) == tokenize("Hi")
