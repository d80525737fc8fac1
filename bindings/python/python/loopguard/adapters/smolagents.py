"""loopguard for smolagents: each tool's calls go through the engine, and a step callback stops
the run.

>>> from loopguard.adapters.smolagents import protect
>>> agent = protect(ToolCallingAgent(tools=[search, read_file], model=model))  # doctest: +SKIP

A refused call raises inside the tool, so smolagents shows the model a failed call whose error
is ``[loopguard: refused] …`` (the tool is not run); a warning is appended to the tool's output;
on ``terminate`` the step callback raises :class:`loopguard.LoopTerminated` out of
``agent.run``.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from smolagents.memory import ActionStep

from .. import Engine, LoopTerminated
from . import Guard, refusal, refuses


class LoopRefused(Exception):
    """Raised inside a tool whose call loopguard refused; smolagents reports it to the model."""


def protect(
    agent: Any,
    engine: Optional[Engine] = None,
    session: str = "default",
    guard: Optional[Guard] = None,
) -> Any:
    """Guards every tool of ``agent`` (but ``final_answer``) and registers the step callback
    that stops the run on ``terminate``; returns the agent."""
    guard = guard if guard is not None else Guard(engine, session)
    stopped: list[LoopTerminated] = []

    def guarded(name: str, forward):
        def run(*args, **kwargs):
            call_id = guard.call_id()
            arguments = kwargs if not args else {"args": list(args), **kwargs}
            try:
                v = guard.on_call(call_id, name, json.loads(json.dumps(arguments, default=str)))
            except LoopTerminated as e:
                stopped.append(e)
                raise LoopRefused(refusal(e.verdict)) from None
            if refuses(v):
                guard._pending.pop(call_id, None)
                raise LoopRefused(refusal(v))
            try:
                output = forward(*args, **kwargs)
            except Exception as e:
                guard.on_result(call_id, f"{type(e).__name__}: {e}", error=True)
                raise
            if not isinstance(output, str):
                return output
            try:
                return guard.on_result(call_id, output)
            except LoopTerminated as e:
                stopped.append(e)
                raise LoopRefused(refusal(e.verdict)) from None

        return run

    for name, tool in agent.tools.items():
        if name != "final_answer":
            tool.forward = guarded(name, tool.forward)

    def on_step(step, agent=None):
        if stopped:
            raise stopped[0]

    agent.step_callbacks.register(ActionStep, on_step)
    return agent


__all__ = ["LoopRefused", "protect"]
