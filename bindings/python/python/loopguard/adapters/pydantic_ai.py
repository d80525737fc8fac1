"""loopguard for PydanticAI (``pydantic-ai-slim``), as a capability that wraps every tool call.

>>> from loopguard.adapters.pydantic_ai import LoopGuard
>>> agent = Agent(model, tools=[read_file], capabilities=[LoopGuard(session=run_id)])  # doctest: +SKIP

Every call of a function tool goes through the engine before it runs (the capability's
``wrap_tool_execute`` hook) and its result after: a refused call is not run and raises
``ToolFailed`` with ``[loopguard: refused] …``, so the model sees a tool return whose
``outcome`` is ``'failed'`` (no retry budget is spent); a warning is appended to the tool's
output; ``terminate`` raises :class:`AgentLoopTerminated` out of ``agent.run`` /
``agent.run_sync``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import pydantic_core
from pydantic_ai import ToolReturn
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import (
    ApprovalRequired,
    CallDeferred,
    SkipToolExecution,
    ToolFailed,
    ToolFailedError,
    ToolRetryError,
)

from .. import Engine, LoopTerminated
from . import Guard, refusal, refuses


class AgentLoopTerminated(LoopTerminated):
    """:class:`loopguard.LoopTerminated` raised out of a PydanticAI run on ``terminate``."""


def _text(value: Any) -> str:
    """What the model reads for a tool's return value: a string as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return pydantic_core.to_json(value, fallback=str).decode()


def _error_text(error: Exception) -> str:
    if isinstance(error, ToolFailedError):
        return str(error)
    if isinstance(error, ToolRetryError):
        return f"retry: {error}"
    return f"{type(error).__name__}: {error}"


class LoopGuard(AbstractCapability[Any]):
    """A PydanticAI capability that puts every function tool call through a loopguard engine.

    One ``session`` per run (or pass a :class:`~loopguard.adapters.Guard` to share one); the
    capability can be given to ``Agent(capabilities=[...])`` or to a single
    ``agent.run(..., capabilities=[...])``. Output tools (structured output) are not tool calls of
    the agent's work and are not observed.
    """

    def __init__(
        self,
        engine: Optional[Engine] = None,
        session: str = "default",
        guard: Optional[Guard] = None,
    ):
        self.guard = guard if guard is not None else Guard(engine, session, AgentLoopTerminated)

    async def wrap_tool_execute(self, ctx, *, call, tool_def, args, handler):
        guard = self.guard
        call_id = call.tool_call_id or guard.call_id()
        arguments = call.args if call.args is not None else {}
        v = guard.on_call(call_id, call.tool_name, arguments)
        if refuses(v):
            guard._pending.pop(call_id, None)
            raise ToolFailed(refusal(v))
        try:
            result = await handler(args)
        except (CallDeferred, ApprovalRequired, SkipToolExecution):
            # Deferred or skipped by another hook: the call has no result to observe here.
            guard._pending.pop(call_id, None)
            raise
        except Exception as e:
            guard.on_result(call_id, _error_text(e), error=True)
            raise
        value = result.return_value if isinstance(result, ToolReturn) else result
        output = _text(value)
        seen = guard.on_result(call_id, output)
        if seen == output:
            return result
        if isinstance(result, ToolReturn):
            return dataclasses.replace(result, return_value=seen)
        return seen


__all__ = ["AgentLoopTerminated", "LoopGuard"]
