"""`loopguard.simulate` gives the interventions `loopctl simulate --json` prints, on every case of
the project's own corpus (tests/corpus)."""

from __future__ import annotations

import json

import pytest

import loopguard

from conftest import ROOT, run_loopctl

CASES = sorted((ROOT / "tests" / "corpus").glob("*.json"))


def test_the_corpus_is_there():
    assert len(CASES) >= 50, "tests/corpus holds the project's cases"


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_simulate_equals_loopctl(case, loopctl):
    out = run_loopctl(loopctl, "simulate", "--json", str(case))
    assert out.returncode in (0, 3), out.stderr
    expected = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    expected = [r for r in expected if "action" in r]
    for r in expected:
        r.pop("file")
    # The same text: the same records, lines included.
    got = loopguard.simulate(case.read_text())
    for r in got:
        assert r.pop("file") == "<messages>"
    assert got == expected
    # The messages as Python objects: the same, but for the lines of a file they never had.
    from_list = loopguard.simulate(json.loads(case.read_text())["messages"])
    assert len(from_list) == len(expected)
    for a, b in zip(from_list, expected):
        a.pop("file"), a.pop("line"), b.pop("line")
    assert from_list == expected
