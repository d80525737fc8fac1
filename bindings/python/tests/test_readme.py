"""The README's Python example runs as written."""

from __future__ import annotations

import re

from conftest import ROOT


def test_the_readme_example_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "the README's Python section has a ```python block"
    exec(compile(code.group(1), "README.md", "exec"), {})


def test_the_package_docstring_example():
    import doctest

    import loopguard

    failures, tried = doctest.testmod(loopguard)
    assert tried > 0 and failures == 0
