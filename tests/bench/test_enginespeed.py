"""How a run's engine step times are read (bench/enginespeed.py): from the client's
inter-token gaps per batch size, stalls left out, and from the engines' own step lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.enginespeed import decode_speed, from_step_lines, main, step_windows, steps_at


def _saved(requests: list[tuple[float, float, list[float]]]) -> dict:
    """What vLLM's client saves, for requests (start, ttft, inter-token gaps)."""
    return {"start_times": [r[0] for r in requests], "ttfts": [r[1] for r in requests],
            "itls": [r[2] for r in requests],
            "latencies": [r[1] + sum(r[2]) for r in requests]}


def test_steps_are_timed_per_batch_and_stalls_are_left_out() -> None:
    alone = [(10.0 * k, 0.05, [0.01] * 30) for k in range(2)]  # one at a time
    together = [(100.0, 0.05, [0.02] * 29 + [1.0]) for _ in range(4)]  # 4 at once, a stall
    speed = decode_speed(_saved(alone + together))
    assert speed is not None
    bins = {b.batch: b for b in speed.bins}
    assert set(bins) == {1, 4}
    assert bins[1].step_s == pytest.approx(0.01) and bins[1].gaps == 60
    assert bins[4].step_s == pytest.approx(0.02) and bins[4].gaps == 4 * 29  # stalls out
    assert speed.gaps == 60 + 116 and speed.batch == 4.0
    # the stalls left out are counted: 4 requests paused 1 s each
    assert (speed.stalls, speed.stall_s, speed.longest_stall_s) == (4, pytest.approx(4.0), 1.0)
    assert decode_speed(_saved([(0.0, 0.05, [])])) is None  # one-token answers: no steps


def test_a_tokens_pair_read_at_once_still_counts_two_steps() -> None:
    """A ~0 gap and a double one (two tokens in one read) average to the step time."""
    speed = decode_speed(_saved([(0.0, 0.05, [0.01, 0.0, 0.02] * 20)]))
    assert speed is not None and speed.step_s == pytest.approx(0.01)


def test_the_engines_own_step_lines_are_timed_per_batch() -> None:
    """vLLM's server's line and lengthwise's (its stat logger, daemon/executors) alike;
    steps with a prompt in them, steps that recompute a preempted request's output (more
    generation tokens than requests) and other lines are left out."""

    def step(n: int, prompts: int, batch: int, ms: float, usage: str, tokens: int = 0) -> str:
        return (f"Iteration({n}): {prompts} context requests, {prompts * 754} context tokens, "
                f"{batch} generation requests, {tokens or batch} generation tokens, iteration "
                f"elapsed time: {ms:.2f} ms, {usage}")

    log = [
        "(APIServer pid=21509) INFO 11-28 22:46:50 [loggers.py:199] Engine 000: "
        + step(7, 0, 3, 2.0, "CPU KV cache usage: 22.2%"),
        "2026-11-28 22:48:19,492 INFO daemon.executors.vllm_engine: executor cpu-0: "
        + step(8, 0, 4, 4.0, "KV cache usage: 50.8%"),
        "executor cpu-0: " + step(9, 1, 4, 30.0, "KV cache usage: 60.0%"),
        "executor cpu-0: " + step(10, 0, 1, 1.5, "KV cache usage: 2.0%"),
        "executor cpu-0: " + step(11, 0, 4, 25.0, "KV cache usage: 90.0%", tokens=420),
        "INFO daemon.core.scheduler: something else, 12 generation requests",
    ]
    speed = from_step_lines(log)
    assert speed is not None and speed.gaps == 3
    assert {b.batch: (b.step_s, b.gaps) for b in speed.bins} == {
        1: (pytest.approx(0.0015), 1), 4: (pytest.approx(0.003), 2)}  # 3 and 4 share a bin
    assert speed.step_s == pytest.approx(0.0025) and speed.batch == 3.0
    assert from_step_lines(log[2:3] + log[4:]) is None  # no decode-only step
    # at one exact batch (bench/closedloop.py): the prompt's step and the recompute left out
    assert steps_at(log, 4) == [pytest.approx(0.004)]
    assert steps_at(log, 3) == [pytest.approx(0.002)] and steps_at(log, 2) == []


def test_a_runs_steps_per_window_show_the_step_time_moving_within_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`--windows`: each run of a server's log (steps with no gap over RUN_GAP_S between
    them) in windows of its time of day: a batch's step time that doubles in the middle of
    a run shows in its window, not in the run's mean."""

    def line(clock: str, batch: int, ms: float) -> str:
        return (f"(APIServer pid=1) INFO 11-29 {clock} [loggers.py:199] Engine 000: "
                f"Iteration(1): 0 context requests, 0 context tokens, {batch} generation "
                f"requests, {batch} generation tokens, iteration elapsed time: {ms} ms, "
                f"CPU KV cache usage: 100.0%")

    log = ([line("12:00:00", 10, 3.0)] * 50 + [line("12:00:03", 10, 3.0)] * 50
           + [line("12:00:05", 10, 6.0)] * 25 + [line("12:00:08", 10, 6.0)] * 25
           + [line("12:00:14", 2, 2.0)] * 10  # 6 s without a step: the next run
           + ["INFO 11-29 12:00:15 something else", line("12:00:15", 12, 3.0)])
    first, second = step_windows(log, window_s=5.0)
    assert [(w.start_s, w.steps) for w in first] == [(0.0, 100), (5.0, 50)]
    assert first[0].busy == pytest.approx(0.06) and first[1].busy == pytest.approx(0.06)
    assert first[0].tokens_per_s == pytest.approx(200.0)
    assert [(b.batch, b.step_s) for b in first[1].bins] == [(16, pytest.approx(0.006))]
    assert [(w.start_s, w.steps) for w in second] == [(0.0, 11)]
    path = tmp_path / "server.log"
    path.write_text("\n".join(log))
    assert main(["--windows", "5", str(path)]) == 0
    out = capsys.readouterr().out
    assert "server.log, segment 1 of 2" in out
    assert "| 5 | 50 | 6% | 100 | 6.0 (50) |" in out
