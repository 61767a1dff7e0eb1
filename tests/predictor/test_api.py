"""The serving API: PredictInput from OpenAI messages."""

from __future__ import annotations

from predictor.api import PredictInput


def test_from_openai_keeps_text_parts() -> None:
    inp = PredictInput.from_openai([{"role": "system", "content": "s"},
                                    {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                 {"type": "image_url"}]}], 7)
    assert [(m.role, m.content) for m in inp.messages] == [("system", "s"), ("user", "hi")]
    assert inp.num_prompt_tokens == 7
