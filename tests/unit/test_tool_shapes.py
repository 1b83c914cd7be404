"""How the tool loop reads and extends each endpoint's bodies (openrelay/worker/tool_shapes.py), on the odd answers
an engine may give; the loop itself runs against real servers in test_tool_calling.py and test_responses.py."""

from __future__ import annotations

from mcp_types import Tool

from openrelay.worker.tool_shapes import ToolCall, shape_for

ADD = Tool(name="add", description="Add two integers.", input_schema={"type": "object", "properties": {}})


def test_chat_shape():
    chat = shape_for("/v1/chat/completions")
    assert chat.offered(ADD) == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.", "parameters": {"type": "object", "properties": {}}}}
    assert chat.defined_name({"type": "function", "function": {"name": "mine"}}) == "mine"
    assert chat.defined_name("junk") is None
    assert chat.conversation({"messages": "not a list"}) is None
    calls = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}, "junk",
             {"id": "c2", "function": {"name": 5}}]
    answer = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": calls}}]}
    assert chat.calls(answer) == [ToolCall("add", "{}", "c1"), ToolCall(None, None, ""), ToolCall(None, None, "c2")]
    assert chat.calls({"choices": []}) == [] and chat.calls({"choices": [{"message": {"content": "hi"}}]}) == []
    request = {"model": "m", "messages": [{"role": "user", "content": "add"}]}
    nxt, conversation = chat.continued(request, request["messages"], answer, [ToolCall("add", "{}", "c1")], ["3"])
    assert nxt == {"model": "m", "messages": conversation}
    assert conversation[1:] == [{"role": "assistant", "content": None, "tool_calls": calls},
                                {"role": "tool", "tool_call_id": "c1", "content": "3"}]


def test_responses_shape():
    responses = shape_for("/v1/responses")
    assert responses.offered(ADD) == {"type": "function", "name": "add", "description": "Add two integers.",
                                      "parameters": {"type": "object", "properties": {}}}
    assert responses.defined_name({"type": "function", "name": "mine"}) == "mine"
    assert responses.defined_name({"type": "web_search"}) is None
    assert responses.conversation({"input": "hi"}) == [{"role": "user", "content": "hi"}]
    assert responses.conversation({"input": 5}) is None and responses.conversation({}) is None
    output = [{"type": "reasoning", "id": "rs_1", "summary": []},
              {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add", "arguments": "{}"},
              {"type": "function_call", "call_id": "call_2", "name": None}, "junk",
              {"type": "message", "role": "assistant", "content": []}]
    answer = {"object": "response", "output": output}
    assert responses.calls(answer) == [ToolCall("add", "{}", "call_1"), ToolCall(None, None, "call_2")]
    assert responses.calls({"output": None}) == [] and responses.calls({}) == []
    request = {"model": "m", "input": "add", "instructions": "be exact"}
    nxt, conversation = responses.continued(request, responses.conversation(request) or [], answer,
                                            [ToolCall("add", "{}", "call_1")], ["3"])
    assert nxt == {"model": "m", "input": conversation, "instructions": "be exact"}
    assert conversation == [{"role": "user", "content": "add"}, *output,
                            {"type": "function_call_output", "call_id": "call_1", "output": "3"}]
