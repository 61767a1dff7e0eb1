"""SCLS's serving-time-oriented batching (its Algorithm 1) and max-min offloading (§4.5-4.6).

Algorithm 1 and Eq. 10-12 survive in the text; the adaptive-interval rule is Eq. 12:
T <- max(lambda * min_w T_load(w), Gamma).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise

ServeTime = Callable[[int, int], float]  # (batch size N, batch input length L_i) -> seconds
Fits = Callable[[int, int], bool]  # (N, L_i) -> the memory estimate allows it (no OOM)


def dp_batches(input_lengths: Sequence[int], serve: ServeTime, fits: Fits) -> list[range]:
    """Split requests, sorted by input length ascending, into consecutive batches that
    minimise the total estimated serving time; each batch is a range of indices.

    T[i] = min over j of T[j-1] + T_serve(i-j+1, L_i) (Eq. 10): since lengths ascend, the
    i-th request's length is the padded input length of any batch ending at it. A request
    alone always fits; a batch grows backwards only while the memory estimate allows it.
    """
    n = len(input_lengths)
    if any(a > b for a, b in pairwise(input_lengths)):
        raise ValueError("input lengths must be sorted ascending")
    total = [0.0] * (n + 1)
    split = [0] * (n + 1)
    for i in range(1, n + 1):
        length = input_lengths[i - 1]
        split[i] = i - 1
        total[i] = total[i - 1] + serve(1, length)
        j = i - 1
        while j > 0 and fits(i - j + 1, length):
            t = total[j - 1] + serve(i - j + 1, length)
            if t < total[i]:
                total[i], split[i] = t, j - 1
            j -= 1
    batches: list[range] = []
    i = n
    while i > 0:
        batches.append(range(split[i], i))
        i = split[i]
    batches.reverse()
    return batches


def max_min_assign(batch_times: Sequence[float], loads: Mapping[str, float]) -> list[str]:
    """Max-min offloading: the batch with the longest estimated serving time goes to the
    least-loaded worker, whose load then grows by it (Eq. 11). Returns each batch's worker,
    aligned with batch_times; ties go to the worker named first in `loads`."""
    load = dict(loads)
    order = sorted(range(len(batch_times)), key=lambda k: -batch_times[k])
    assigned = [""] * len(batch_times)
    for k in order:
        worker = min(load, key=lambda name: load[name])
        assigned[k] = worker
        load[worker] += batch_times[k]
    return assigned


def next_interval(loads: Mapping[str, float], factor: float, minimum_s: float) -> float:
    """Eq. 12: a light load shortens the interval (requests go out sooner), a heavy one
    lengthens it (bigger batches); factor < 1 keeps workers from idling when the load is
    over-estimated, the minimum keeps batches from being too small when it is under-."""
    return max(factor * min(loads.values(), default=0.0), minimum_s)
