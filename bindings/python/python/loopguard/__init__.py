"""loopguard: tool-call loop detection for LLM agents, in-process.

The engine watches the stream of tool calls, tool results and assistant text of each session
and answers every event with a :class:`Verdict`: let it run (``allow``), run it with a nudge to
the model (``warn``), ask the user (``ask``), refuse it (``block``) or stop the run
(``terminate``).

>>> import loopguard
>>> engine = loopguard.Engine()                  # the built-in default policy
>>> actions = []
>>> for i in range(4):
...     actions.append(engine.call("run-1", f"c{i}", "read_file", {"path": "a.txt"}).action)
...     actions.append(engine.result("run-1", f"c{i}", "same text").action)
>>> [str(a) for a in actions]
['allow', 'allow', 'allow', 'allow', 'allow', 'warn', 'block', 'allow']

Adapters for agent frameworks live in :mod:`loopguard.adapters`.
"""

from __future__ import annotations

import enum


class Action(str, enum.Enum):
    """What the host should do with an event. A ``str`` enum: ``Action.WARN == "warn"``."""

    ALLOW = "allow"
    WARN = "warn"
    ASK = "ask"
    BLOCK = "block"
    TERMINATE = "terminate"

    def __str__(self) -> str:
        return self.value


from ._loopguard import (  # noqa: E402  (Action must exist before verdicts are made)
    Engine,
    Policy,
    PolicyError,
    SnapshotError,
    Verdict,
    simulate,
)


class LoopTerminated(RuntimeError):
    """Raised by the adapters when the engine stops a run (``terminate``)."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.message or "loopguard stopped the run")
        self.verdict = verdict


__all__ = [
    "Action",
    "Engine",
    "LoopTerminated",
    "Policy",
    "PolicyError",
    "SnapshotError",
    "Verdict",
    "simulate",
]
