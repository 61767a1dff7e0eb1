"""Which room may import which: the contracts in pyproject.toml ([tool.importlinter]) are kept,
and no module of the daemon, policies, predictor, kvstore or bench is in an import cycle."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "root_packages"]
# Cycles that work under way removes: delete an entry when that work lands.
KNOWN_CYCLES: set[frozenset[str]] = set()


def test_import_contracts_are_kept() -> None:
    # From the repository's root, which lint-imports puts first on sys.path: this checkout's
    # packages, whatever else the environment has installed.
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache",
                             "--no-logo"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_module_is_in_an_import_cycle() -> None:
    for package in PACKAGES:  # the graph must be of this checkout, not of an installed copy
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None
        assert Path(spec.origin).is_relative_to(ROOT), f"{package} is imported from {spec.origin}"
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    loops = [loop for members, loop in _cycles(graph) if members not in KNOWN_CYCLES]
    assert not loops, "import cycles:\n" + "\n".join(" -> ".join(loop) for loop in loops)


def _cycles(graph: grimp.ImportGraph) -> list[tuple[frozenset[str], tuple[str, ...]]]:
    """Each strongly connected set of modules (more than one), with one loop through it."""
    cyclic = [(a, b) for a in sorted(graph.modules)
              for b in sorted(graph.find_modules_directly_imported_by(a))
              if graph.find_shortest_chain(importer=b, imported=a) is not None]
    group = {module: {module} for edge in cyclic for module in edge}
    for a, b in cyclic:  # an edge whose head reaches its tail: both in one set
        if group[a] is not group[b]:
            merged = group[a] | group[b]
            for module in merged:
                group[module] = merged
    loops = []
    for members in {id(g): g for g in group.values()}.values():
        first = min(members)
        back = next(b for a, b in cyclic if a == first)
        chain = graph.find_shortest_chain(importer=back, imported=first)
        assert chain is not None
        loops.append((frozenset(members), (first, *chain)))
    return sorted(loops, key=lambda found: found[1])
