"""Serving API the daemon calls (synchronously, from one worker thread at a time)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import msgspec

from predictor.records import Message, Record


class PredictInput(msgspec.Struct, frozen=True):
    messages: list[Message]  # conversation up to and including the user turn to answer
    num_prompt_tokens: int = 0  # serving-model tokens of the templated prompt (0: unknown)

    @classmethod
    def from_openai(cls, messages: Sequence[dict], num_prompt_tokens: int = 0) -> PredictInput:
        """OpenAI chat messages; list-of-parts content keeps only its text parts."""
        return cls(messages=[Message(role=str(m.get("role", "user")),
                                     content=_text_of(m.get("content")))
                             for m in messages], num_prompt_tokens=num_prompt_tokens)

    @classmethod
    def from_record(cls, record: Record, num_prompt_tokens: int = 0) -> PredictInput:
        return cls(messages=list(record.messages), num_prompt_tokens=num_prompt_tokens)


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
    return ""


class Predictor(ABC):
    """predict(batch) -> predicted total output tokens, one float per input."""

    kind: str
    path: Path
    chars_per_token: float  # of responses in the training data: turns partial text into tokens

    @abstractmethod
    def predict(self, batch: list[PredictInput]) -> list[float]: ...

    def predict_quantiles(self, batch: list[PredictInput],
                          qs: Sequence[float] = (0.5, 0.9)) -> list[tuple[float, ...]]:
        """Quantiles of the total output tokens, one tuple (ordered as `qs`) per input.
        Models trained with `--quantiles` answer for levels within the trained range."""
        raise NotImplementedError(f"{self.kind} predictor has no quantile outputs")

    def predict_with_upper(self, batch: list[PredictInput], q: float
                           ) -> tuple[list[float], list[float] | None]:
        """Point predictions and the q-quantile of each (None: the model has none for q).
        Models with a quantile head override it to answer both from one pass."""
        points = self.predict(batch)
        try:
            upper = [row[0] for row in self.predict_quantiles(batch, (q,))]
        except (NotImplementedError, ValueError):
            return points, None
        return points, upper

    def predict_remaining(self, batch: list[tuple[PredictInput, str]]) -> list[float]:
        """Non-iterative fallback: total prediction minus the tokens already generated."""
        totals = self.predict([inp for inp, _ in batch])
        return [max(1.0, total - self.tokens_in(partial))
                for total, (_, partial) in zip(totals, batch)]

    def tokens_in(self, text: str) -> float:
        return len(text) / self.chars_per_token

    def observe(self, inp: PredictInput, output_tokens: int) -> None:
        """Online update after a completion; only the retrieval predictor learns online."""

    def save(self) -> None:
        """Persist online state (crash-safe); nothing to persist for static predictors."""
