"""The serving API: PredictInput from OpenAI messages and records; Predictor's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictor.api import PredictInput, Predictor
from predictor.records import Message, Record


def test_from_openai_keeps_text_parts() -> None:
    inp = PredictInput.from_openai([{"role": "system", "content": "s"},
                                    {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                 {"type": "image_url"}]}], 7)
    assert [(m.role, m.content) for m in inp.messages] == [("system", "s"), ("user", "hi")]
    assert inp.num_prompt_tokens == 7


def test_from_openai_drops_content_it_cannot_read() -> None:
    inp = PredictInput.from_openai([{"content": None}, {"role": "user", "content": 3}])
    assert [(m.role, m.content) for m in inp.messages] == [("user", ""), ("user", "")]


def test_from_record_copies_the_conversation() -> None:
    record = Record(id="c#1", messages=[Message("user", "q")], response="a", output_tokens=1)
    inp = PredictInput.from_record(record, 12)
    assert inp.messages == record.messages and inp.messages is not record.messages
    assert inp.num_prompt_tokens == 12


class _Fixed(Predictor):
    kind = "fixed"
    path = Path("fixed")
    chars_per_token = 4.0

    def predict(self, batch: list[PredictInput]) -> list[float]:
        return [100.0] * len(batch)


def test_defaults_subtract_the_partial_answer_and_learn_nothing() -> None:
    predictor = _Fixed()
    inp = PredictInput(messages=[Message("user", "q")])
    assert predictor.tokens_in("x" * 40) == 10.0
    assert predictor.predict_remaining([(inp, ""), (inp, "x" * 40), (inp, "x" * 4000)]) == [
        100.0, 90.0, 1.0]
    with pytest.raises(NotImplementedError, match="fixed predictor has no quantile outputs"):
        predictor.predict_quantiles([inp])
    predictor.observe(inp, 5)
    predictor.save()
    assert predictor.predict([inp]) == [100.0]
