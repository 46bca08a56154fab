"""Every reader under hostile input at a CI-sized budget: findings or a clean verdict, never a traceback, a
hang, an unpickled global, a started process or a stray write. `python -m tests.fuzz_all` runs the same
properties at 10,000 examples per reader.

Runs are reproducible (`derandomize=True`, no example database): a failure here fails the same way on the
next run and on the lead's machine.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.fuzz.properties import READERS
from tests.fuzz.regressions import REGRESSIONS, STILL_BROKEN
from tests.fuzz.workspace import Workspace

CI_EXAMPLES = int(os.environ.get("ITERA_FUZZ_EXAMPLES", "100"))
# No shrinking in CI: a failing example is printed as found (derandomized, so it comes back the same), and a
# known failure marked xfail costs seconds, not the minutes a shrink of a 100 kB input can take.
FUZZ_SETTINGS = settings(max_examples=CI_EXAMPLES, deadline=None, derandomize=True, database=None,
                         phases=[Phase.explicit, Phase.reuse, Phase.generate],
                         suppress_health_check=list(HealthCheck), print_blob=True)


@pytest.fixture(scope="module")
def workspace(built, tmp_path_factory) -> Workspace:
    return Workspace(built["package"], built["hf_cache"], tmp_path_factory.mktemp("fuzz"))


# 5-13 s each: the slow lane; `make test-fast` keeps the replays of every input that once broke a reader (below).
@pytest.mark.slow
@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
def test_reader_survives_hostile_input(reader, workspace):
    if not reader.tools_present():
        pytest.skip(f"{reader.name}: the outside program it compares with is not installed")

    @FUZZ_SETTINGS
    @given(reader.strategy(workspace))
    def survives(example):
        reader.check(workspace, example)

    survives()


REPLAYED = [pytest.param(name, label, example, id=f"{name}: {label}",
                         marks=[pytest.mark.xfail(strict=True, reason=STILL_BROKEN[(name, label)])]
                         if (name, label) in STILL_BROKEN else [])
            for name, cases in REGRESSIONS.items() for label, example in cases]


@pytest.mark.parametrize("name,label,example", REPLAYED)
def test_reader_survives_what_once_broke_it(name, label, example, workspace):
    reader = next(r for r in READERS if r.name == name)
    if not reader.tools_present():
        pytest.skip(f"{reader.name}: the outside program it compares with is not installed")
    reader.check(workspace, example(workspace) if callable(example) else example)


def test_every_reader_imports_the_module_it_fuzzes():
    """A reader whose module moved must fail here, not skip: each property names real modules of the tool."""
    import importlib

    import tests.fuzz.properties as properties

    source = open(properties.__file__, encoding="utf-8").read()
    modules = sorted(set(__import__("re").findall(r"itera_verify(?:\.[a-z_]+)+", source)))
    assert modules, "the fuzz properties name no module of the tool"
    for dotted in modules:
        # a dotted name may end in an attribute: import the longest prefix that is a module
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        assert cut > 1, f"{dotted}: no module of that name"
