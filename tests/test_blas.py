"""The daemon's process runs its BLAS libraries on one thread (daemon/blas.py): numpy's and
scipy's, and faiss's, which the predictor loads later."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_CHILD = """
import json, numpy, scipy.optimize, threadpoolctl
from daemon import blas

def threads():
    return {i["filepath"].split("/")[-2]: i["num_threads"]
            for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}

before = threads()
blas.one_thread()
import faiss  # loaded later, as the predictor loads it
loaded = threads()
blas.one_thread()
print(json.dumps([before, loaded, threads()]))
"""


def test_every_blas_library_runs_on_one_thread() -> None:
    # In a process of its own: the limit is process-wide, and the suite's BLAS keeps its.
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          check=True, timeout=120)
    before, loaded, after = json.loads(done.stdout)
    if len(os.sched_getaffinity(0)) > 1:  # else one thread is the default anyway
        assert min(before.values()) > 1 and loaded["faiss_cpu.libs"] > 1
    assert set(after) >= {"numpy.libs", "scipy.libs", "faiss_cpu.libs"}
    assert set(after.values()) == {1}, after
