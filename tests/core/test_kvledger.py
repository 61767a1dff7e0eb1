"""The KV ledger and the room it forecasts (daemon/core/admission.py), without a core: what
the running jobs hold, the peak of their projected KV, and when a job finds room."""

from __future__ import annotations

import math

from daemon.core.admission import (
    KVLedger,
    seconds_until_fits,
    seconds_until_room,
    seconds_until_started,
)
from daemon.core.events import Capacity


def test_the_ledger_sums_to_zero_when_empty() -> None:
    ledger = KVLedger()
    ledger.reserve("a", 17)
    ledger.reserve("b", 16)
    assert ledger.blocks == 3
    ledger.reserve("a", 40)  # replaces its reservation
    assert ledger.blocks == 4 and len(ledger) == 2
    ledger.remove("a")
    ledger.remove("b")
    ledger.remove("b")
    assert ledger.blocks == 0 and len(ledger) == 0


def test_the_peak_of_the_projected_kv_is_below_the_sum_of_footprints() -> None:
    """Two jobs of 100-token contexts, one ending in 10 steps, one in 300: at most they
    hold 110 + 110 tokens together (then the first frees its blocks) and 400 alone, so
    the peak is the second's 400 (+ partial blocks), not the sum 510."""
    ledger = KVLedger()
    ledger.block_size = 10
    ledger.reserve("short", 110, context_tokens=100)
    ledger.reserve("long", 400, context_tokens=100)
    assert ledger.blocks == 11 + 40
    assert ledger.peak_blocks() == 40 + 1  # one partial block counted whole
    # a third job of context 50 ending in 200 steps: at t = 200 it holds 250, long 300
    assert ledger.peak_blocks([(50, 250)]) == 55 + 2
    # jobs that all end together peak at the sum
    same = KVLedger()
    same.block_size = 10
    for name in "abc":
        same.reserve(name, 100, context_tokens=40)
    assert same.peak_blocks() == 30 + 3
    ledger.grow("short", 105)  # its context grew; its end is 5 steps closer
    assert ledger.peak_blocks() == 40 + 1
    ledger.remove("long")
    assert ledger.peak_blocks() == 11 + 1


def test_room_now_comes_before_the_peak_fits_and_the_running_jobs_grow_meanwhile() -> None:
    """Work-conserving admission starts a job once its context fits in the KV held now:
    two running jobs of 40-token contexts (4 blocks each with their next tokens, 8 of 10)
    end in 0.5 s and 2 s; a job of 30 context tokens (3 blocks) finds room when the first
    ends if the other has grown 50 tokens by then (7 blocks), not if it has grown 100 (10).
    The projected peak of its 200-token footprint fits only once both have ended."""
    capacity = Capacity("e0", kv_blocks=10, block_size=16, max_num_seqs=8)
    ledger = KVLedger()
    ledger.reserve("a", 90, context_tokens=40)
    ledger.reserve("b", 240, context_tokens=40)
    ends = [(0.5, "a"), (2.0, "b")]
    assert seconds_until_room(capacity, ledger, ends, 30, step_s=0.01) == 0.5
    assert seconds_until_room(capacity, ledger, ends, 30, step_s=0.005) == 2.0
    assert seconds_until_room(capacity, ledger, ends, 8, step_s=0.01) == 0.0  # 2 blocks fit
    # a job ahead of it (2 blocks) takes the room first: with b grown, 7 + 2 + 2 > 10
    assert seconds_until_room(capacity, ledger, ends, 8, [8], step_s=0.01) == 2.0
    assert seconds_until_room(capacity, ledger, ends, 500, step_s=0.01) == 2.0  # empty lane
    assert seconds_until_room(capacity, ledger, [(0.5, "a"), (math.inf, "b")], 500,
                              step_s=0.01) == math.inf  # an end never predicted
    assert seconds_until_fits(capacity, ledger, ends, 200, 30) == 2.0


def test_the_jobs_ahead_take_the_room_that_frees_and_give_it_back_when_they_end() -> None:
    """Queue and memory in one forecast (seconds_until_started): two running jobs of
    20-token contexts (3 blocks each with their next tokens, 6 of 10) end in 0.5 s and 2 s;
    a job ahead of 40 context tokens (4 blocks) starts now and ends in 0.3 s; a new job of
    40 finds room when the first running job ends, once the other has grown 50 tokens (6
    blocks + 4). Counting the job ahead as held from now on (seconds_until_room) waits for
    the second end; so does a lane that runs at most two jobs."""
    capacity = Capacity("e0", kv_blocks=10, block_size=16, max_num_seqs=8)
    ledger = KVLedger()
    ledger.reserve("a", 100, context_tokens=20)
    ledger.reserve("b", 300, context_tokens=20)
    ends = [(0.5, "a"), (2.0, "b")]
    assert seconds_until_started(capacity, ledger, ends, 40, [(40, 0.3)], step_s=0.01) == 0.5
    assert seconds_until_room(capacity, ledger, ends, 40, [40], step_s=0.01) == 2.0
    # at 0.3 s, without growth, the running jobs still hold 3 blocks each: 3 + 3 + 4 fit
    assert seconds_until_started(capacity, ledger, ends, 40, [(40, 0.3)]) == 0.3
    # two slots: the job ahead starts when "a" ends (0.5 s), and when it ends (0.8 s) "b"
    # has grown 80 tokens (8 blocks): the new job waits for "b"
    assert seconds_until_started(capacity, ledger, ends, 40, [(40, 0.3)], step_s=0.01,
                                 slots=2) == 2.0
    assert seconds_until_started(capacity, ledger, ends, 8, step_s=0.01) == 0.0  # fits now
    assert seconds_until_started(capacity, KVLedger(), [], 5000) == 0.0  # an empty lane
    assert seconds_until_started(capacity, ledger, [(0.5, "a"), (math.inf, "b")], 500,
                                 step_s=0.01) == math.inf  # behind an end never predicted
