"""Re-prediction of running jobs off the decision loop: one batch in flight, requests in the
meantime form the next, answers are revised predictions in the inbox, and a failed, slow or
cancelled batch keeps the old predictions without failing a job."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from daemon.config import PoliciesConfig
from daemon.core.events import Event, Predicted
from daemon.core.job import Job, JobStatus
from daemon.core.repredict import Repredictor
from policies.isrtf import ISRTFParams
from tests.policies import harness
from tests.policies.fakes import job
from tests.policies.harness import Spec


def test_simultaneous_checkpoints_share_one_batch() -> None:
    sizes: list[int] = []

    async def predictor(jobs: Sequence[Job]) -> list[float]:
        sizes.append(len(jobs))
        await asyncio.sleep(0.05)
        return [100.0] * len(jobs)

    workload = [Spec(0.0, 30, 80, predicted=80.0) for _ in range(4)]
    params = PoliciesConfig(isrtf=ISRTFParams(window_tokens=10))
    harness.run(harness.make_config("isrtf", max_running=4, policies=params), workload,
                predictor=predictor)
    assert sizes == [4] * 7  # 4 jobs x 7 windows (10..70 of 80 tokens), 7 calls


@pytest.mark.parametrize("behaviour", ["raise", "hang", "wrong-count"])
def test_a_failing_predictor_keeps_old_predictions_and_loses_no_job(behaviour: str) -> None:
    async def predictor(jobs: Sequence[Job]) -> list[float]:
        if behaviour == "raise":
            raise RuntimeError("model exploded")
        if behaviour == "hang":
            await asyncio.sleep(3600)
        return []

    workload = [Spec(0.01 * i, 30, 40, predicted=33.0) for i in range(3)]
    params = PoliciesConfig(isrtf=ISRTFParams(window_tokens=10, repredict_timeout_s=0.5))
    result = harness.run(harness.make_config("isrtf", max_running=2, policies=params),
                         workload, predictor=predictor)
    assert all(j.status is JobStatus.FINISHED for j in result.jobs)
    assert all(j.predicted_output_tokens == 33.0 for j in result.jobs)
    assert result.scheduler.repredictor.failures >= 1


def _drained(inbox: asyncio.Queue[Event]) -> list[Event]:
    return [inbox.get_nowait() for _ in range(inbox.qsize())]


async def _batch_answered(inbox: asyncio.Queue[Event]) -> list[Event]:
    """The events put once the first arrives: the re-predictor puts a batch's events in one
    go (and these tests' predictors answer a next batch before it yields)."""
    first = await asyncio.wait_for(inbox.get(), 1.0)
    return [first, *_drained(inbox)]


@pytest.mark.asyncio
async def test_answers_count_from_the_tokens_there_were_when_asked() -> None:
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    a, b = job("a", generated=10), job("b", generated=20)

    async def predict(jobs: Sequence[Job]) -> list[float]:
        a.generated_token_ids += [7] * 5  # generated while the model ran: inside its answer
        return [30.0, 0.2]

    repredictor = Repredictor(inbox, predict)
    repredictor.request(a)
    repredictor.request(b)
    assert await _batch_answered(inbox) == [
        Predicted("a", 40.0, revised=True),
        Predicted("b", 21.0, revised=True)]  # at least one more token
    assert (repredictor.batches, repredictor.jobs, repredictor.failures) == (1, 2, 0)


@pytest.mark.asyncio
async def test_requests_during_a_batch_form_the_next_one() -> None:
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    asked: list[list[tuple[str, int]]] = []
    release = asyncio.Event()

    async def predict(jobs: Sequence[Job]) -> list[float]:
        asked.append([(j.job_id, j.num_generated_tokens) for j in jobs])
        await release.wait()
        return [100.0] * len(jobs)

    a, b, c = job("a", generated=1), job("b", generated=2), job("c", generated=3)
    repredictor = Repredictor(inbox, predict)
    repredictor.request(a)
    await asyncio.sleep(0)  # the first batch is in flight
    repredictor.request(b)
    repredictor.request(c)
    b.generated_token_ids.append(7)
    repredictor.request(b)  # asked again before its batch went: asked once, at 3 tokens
    release.set()  # the next batch runs as soon as the first is answered
    assert await _batch_answered(inbox) == [Predicted("a", 101.0, revised=True),
                                            Predicted("b", 103.0, revised=True),
                                            Predicted("c", 103.0, revised=True)]
    assert asked == [[("a", 1)], [("b", 3), ("c", 3)]]
    assert repredictor.batches == 2


@pytest.mark.asyncio
async def test_jobs_that_ended_are_neither_asked_about_nor_revised() -> None:
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    gone = job("gone", status=JobStatus.ABORTED)
    ending, live = job("ending"), job("live")
    asked: list[str] = []

    async def predict(jobs: Sequence[Job]) -> list[float]:
        asked.extend(j.job_id for j in jobs)
        ending.status = JobStatus.FINISHED  # ends while the model runs
        return [50.0] * len(jobs)

    repredictor = Repredictor(inbox, predict)
    for j in (gone, ending, live):
        repredictor.request(j)
    assert await _batch_answered(inbox) == [Predicted("live", 50.0, revised=True)]
    assert asked == ["ending", "live"] and repredictor.jobs == 1


@pytest.mark.asyncio
async def test_close_cancels_the_batch_in_flight() -> None:
    inbox: asyncio.Queue[Event] = asyncio.Queue()
    started = asyncio.Event()

    async def predict(jobs: Sequence[Job]) -> list[float]:
        started.set()
        await asyncio.sleep(3600)
        return [1.0] * len(jobs)

    repredictor = Repredictor(inbox, predict)
    repredictor.timeout_s = 3600.0
    repredictor.request(job("a"))
    await asyncio.wait_for(started.wait(), 1.0)
    await asyncio.wait_for(repredictor.close(), 1.0)
    assert inbox.empty() and repredictor.failures == 0  # a shutdown, not a predictor fault
