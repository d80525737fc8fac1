"""Adapters that put loopguard into agent frameworks' own run loops.

- :mod:`loopguard.adapters.openai_agents`: the OpenAI Agents SDK (tool guardrails);
- :mod:`loopguard.adapters.langchain`: LangChain / LangGraph (a tool wrapper);
- :mod:`loopguard.adapters.smolagents`: smolagents (a tool wrapper);
- :mod:`loopguard.adapters.pydantic_ai`: PydanticAI (a capability's ``wrap_tool_execute``);
- :mod:`loopguard.adapters.agent_framework`: Microsoft Agent Framework (function middleware);
- :mod:`loopguard.adapters.crewai`: CrewAI (tool-call hooks scoped to a run).

Each does the same with the engine's verdicts: every tool call and result is observed; a
``warn`` reaches the model appended to the tool's output; a ``block`` (or ``ask``, which has no
user to ask in an unattended run) replaces the call with a failed tool result carrying the
refusal, so the model sees a refused call, never a plain answer; a ``terminate`` raises
:class:`loopguard.LoopTerminated` out of the framework's run.

The frameworks are imported only by the module of each adapter.
"""

from __future__ import annotations

from .. import Action, Engine, LoopTerminated, Verdict

#: How a refused call reads to the model (and to anyone reading the run).
REFUSED = "[loopguard: refused] "
#: How a warning reads to the model, after the tool's output.
WARNING = "[loopguard: warning] "


def refusal(verdict: Verdict) -> str:
    """The tool result that stands for a refused call."""
    return REFUSED + (verdict.message or "this call repeats a loop and was not run")


def with_warning(output: str, verdicts: list[Verdict]) -> str:
    """The tool's output with the warnings of the call and its result appended."""
    notes = [v.message for v in verdicts if v.action == Action.WARN and v.message]
    if not notes:
        return output
    return output + "\n\n" + "\n".join(WARNING + n for n in notes)


def stop_on_terminate(verdict: Verdict, error: type = LoopTerminated) -> Verdict:
    """Raises ``error`` (a :class:`LoopTerminated`) for a ``terminate`` verdict; returns any
    other."""
    if verdict.action == Action.TERMINATE:
        raise error(verdict)
    return verdict


def refuses(verdict: Verdict) -> bool:
    """Whether the call must not run: ``block``, or ``ask`` with nobody to ask."""
    return verdict.action in (Action.BLOCK, Action.ASK)


class Guard:
    """The adapters' shared state: one engine, one session, the warnings waiting for results."""

    def __init__(
        self,
        engine: Engine | None = None,
        session: str = "default",
        error: type = LoopTerminated,
    ):
        self.engine = engine if engine is not None else Engine()
        self.session = session
        #: What terminate raises: a :class:`LoopTerminated` the framework lets through.
        self.error = error
        self._pending: dict[str, list[Verdict]] = {}
        self._next = 0

    def call_id(self) -> str:
        """A call id for frameworks that give none."""
        self._next += 1
        return f"loopguard-{self._next}"

    def on_call(self, call_id: str, tool: str, arguments) -> Verdict:
        """Observes a call; raises on terminate. The caller refuses it when :func:`refuses`."""
        v = stop_on_terminate(self.engine.call(self.session, call_id, tool, arguments), self.error)
        self._pending[call_id] = [v]
        return v

    def on_result(self, call_id: str, output: str, error: bool = False) -> str:
        """Observes a result; raises on terminate; returns the output the model should see."""
        r = stop_on_terminate(
            self.engine.result(self.session, call_id, output, error=error), self.error
        )
        return with_warning(output, self._pending.pop(call_id, []) + [r])


__all__ = ["Guard", "REFUSED", "WARNING", "refusal", "refuses", "stop_on_terminate", "with_warning"]
