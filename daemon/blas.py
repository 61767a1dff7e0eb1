"""One BLAS thread in the daemon's process.

numpy's and scipy's OpenBLAS start a thread per core. On a host whose cores the engines keep
busy, a BLAS call on the event loop (the learned clock's fit, core/clock.py) then waits for
a helper thread that the kernel gives no core: the daemon's loop stood still 1-3 s inside
the fit's least squares in 9 of the sweeps' lengthwise runs (daemon/http/loopwatch.py's
stacks), every stream and admission with it. The daemon's matrices are small (a 1,024 x 5
fit, a predictor's batch); one thread loses nothing on them. The engines are processes of
their own and keep their threads.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def one_thread() -> None:
    """Every BLAS library loaded so far runs on the calling process's one thread; call it
    again after loading another (the predictor's faiss)."""
    threadpool_limits(limits=1, user_api="blas")
