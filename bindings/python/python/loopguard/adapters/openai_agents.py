"""loopguard for the OpenAI Agents SDK (``openai-agents``), through its tool guardrails.

>>> from loopguard.adapters.openai_agents import protect
>>> agent = Agent(name="coder", tools=protect([read_file, run_tests]))  # doctest: +SKIP

Every call of a protected tool is observed before it runs and every output after: a refused call
becomes the tool output ``[loopguard: refused] …`` (the SDK's ``reject_content``: the model sees
a failed call and the run goes on), a warning is appended to the output, and ``terminate`` raises
:class:`loopguard.LoopTerminated` out of ``Runner.run``.
"""

from __future__ import annotations

from typing import Iterable, Optional

from agents import (
    AgentsException,
    FunctionTool,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    ToolOutputGuardrailData,
    tool_input_guardrail,
    tool_output_guardrail,
)

from .. import Engine, LoopTerminated
from . import Guard, refusal, refuses


class AgentLoopTerminated(LoopTerminated, AgentsException):
    """:class:`loopguard.LoopTerminated` as the SDK lets it through ``Runner.run`` unwrapped."""

    def __init__(self, verdict):
        LoopTerminated.__init__(self, verdict)


def protect(
    tools: Iterable[FunctionTool],
    engine: Optional[Engine] = None,
    session: str = "default",
    guard: Optional[Guard] = None,
) -> list[FunctionTool]:
    """Adds loopguard's input and output guardrails to each function tool; returns the tools.

    One ``session`` per run (or pass a :class:`~loopguard.adapters.Guard` to share one).
    """
    guard = guard if guard is not None else Guard(engine, session, AgentLoopTerminated)

    @tool_input_guardrail(name="loopguard")
    def before(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        v = guard.on_call(ctx.tool_call_id, ctx.tool_name, ctx.tool_arguments or "{}")
        if refuses(v):
            # The refused call gets no output guardrail: nothing waits for its result.
            guard._pending.pop(ctx.tool_call_id, None)
            return ToolGuardrailFunctionOutput.reject_content(refusal(v), output_info=v)
        return ToolGuardrailFunctionOutput.allow()

    @tool_output_guardrail(name="loopguard")
    def after(data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        output = str(data.output)
        seen = guard.on_result(data.context.tool_call_id, output)
        if seen != output:
            return ToolGuardrailFunctionOutput.reject_content(seen)
        return ToolGuardrailFunctionOutput.allow()

    out = []
    for tool in tools:
        tool.tool_input_guardrails = [*(tool.tool_input_guardrails or []), before]
        tool.tool_output_guardrails = [*(tool.tool_output_guardrails or []), after]
        out.append(tool)
    return out


__all__ = ["AgentLoopTerminated", "protect"]
