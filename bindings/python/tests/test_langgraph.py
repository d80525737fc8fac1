"""The LangGraph adapter, in a real LangGraph graph (model node ⇄ guarded ToolNode), with a
scripted model."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

import loopguard
from loopguard.adapters.langchain import tool_node


def graph_with(script: list[AIMessage], runs: list[str]):
    @tool
    def read_file(path: str) -> str:
        """Reads a file."""
        runs.append(path)
        return "line 1: nothing changed here"

    steps = iter(script)

    def model(state: MessagesState):
        return {"messages": [next(steps)]}

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", tool_node([read_file], session="thread-1"))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition, {"tools": "tools", END: END})
    g.add_edge("tools", "model")
    return g.compile()


def calls(paths: list[str]) -> list[AIMessage]:
    return [
        AIMessage(content="", tool_calls=[{"name": "read_file", "args": {"path": p}, "id": f"call_{i}"}])
        for i, p in enumerate(paths)
    ]


def test_a_looping_graph_is_warned_refused_and_stopped():
    runs: list[str] = []
    graph = graph_with(calls(["a.txt"] * 12) + [AIMessage(content="done")], runs)
    seen: list[ToolMessage] = []
    with pytest.raises(loopguard.LoopTerminated) as stopped:
        for update in graph.stream({"messages": [HumanMessage("read a.txt")]}, {"recursion_limit": 60}):
            for m in update.get("tools", {}).get("messages", []):
                seen.append(m)
    assert stopped.value.verdict.action == loopguard.Action.TERMINATE
    texts = [m.content for m in seen]
    warned = next(i for i, t in enumerate(texts) if "[loopguard: warning]" in t)
    refused = next(i for i, t in enumerate(texts) if t.startswith("[loopguard: refused]"))
    assert warned < refused
    assert seen[refused].status == "error"
    # Refused calls never ran.
    assert len(runs) < len(seen)


def test_a_healthy_graph_is_never_touched():
    runs: list[str] = []
    graph = graph_with(calls([f"src/f{i}.rs" for i in range(6)]) + [AIMessage(content="done")], runs)
    out = graph.invoke({"messages": [HumanMessage("read the sources")]}, {"recursion_limit": 60})
    assert out["messages"][-1].content == "done"
    assert len(runs) == 6
    assert not any("loopguard" in str(m.content) for m in out["messages"])
