"""How a tool loop speaks each endpoint (chat completions, Responses): where the conversation is, how tools are
offered, how calls come back and are answered, the stateless way (docs/tool-calling.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from mcp_types import Tool

__all__ = ["ToolCall", "ToolShape", "shape_for"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str | None
    arguments: Any  # the model's arguments as it sent them: a JSON string, usually
    call_id: Any  # what the result is fed back under, as the model sent it


class ToolShape(Protocol):
    def offered(self, tool: Tool) -> dict[str, Any]:
        """A server's tool as the model is offered it."""
        ...

    def defined_name(self, tool: Any) -> str | None:
        """The name of a tool the record defines itself (None for one without a name)."""
        ...

    def conversation(self, request: dict[str, Any]) -> list[Any] | None:
        """The conversation so far, or None when the body has none to extend (the engine says what is wrong)."""
        ...

    def calls(self, body: dict[str, Any]) -> list[ToolCall]:
        """The tool calls of a model's answer, in order; empty when it answered without one."""
        ...

    def continued(self, request: dict[str, Any], conversation: list[Any], body: dict[str, Any],
                  calls: list[ToolCall], results: list[str]) -> tuple[dict[str, Any], list[Any]]:
        """The next request, and its conversation: the answer's turn and one result per call appended."""
        ...


def _schema(tool: Tool) -> dict[str, Any]:
    definition: dict[str, Any] = {"name": tool.name}
    if tool.description:
        definition["description"] = tool.description
    definition["parameters"] = tool.input_schema
    return definition


class ChatShape:
    def offered(self, tool: Tool) -> dict[str, Any]:
        return {"type": "function", "function": _schema(tool)}

    def defined_name(self, tool: Any) -> str | None:
        function = tool.get("function") if isinstance(tool, dict) else None
        return function.get("name") if isinstance(function, dict) else None

    def conversation(self, request: dict[str, Any]) -> list[Any] | None:
        messages = request.get("messages")
        return messages if isinstance(messages, list) else None

    def calls(self, body: dict[str, Any]) -> list[ToolCall]:
        calls = _assistant_message(body).get("tool_calls")
        if not isinstance(calls, list):
            return []
        found = []
        for call in calls:
            call = call if isinstance(call, dict) else {}
            function = given if isinstance(given := call.get("function"), dict) else {}
            name = function.get("name")
            found.append(ToolCall(name=name if isinstance(name, str) else None, arguments=function.get("arguments"),
                                  call_id=call.get("id", "")))
        return found

    def continued(self, request: dict[str, Any], conversation: list[Any], body: dict[str, Any],
                  calls: list[ToolCall], results: list[str]) -> tuple[dict[str, Any], list[Any]]:
        message = _assistant_message(body)
        turn = {"role": "assistant", "content": message.get("content"), "tool_calls": message.get("tool_calls")}
        answers = [{"role": "tool", "tool_call_id": call.call_id, "content": result}
                   for call, result in zip(calls, results, strict=True)]
        messages = [*conversation, turn, *answers]
        return {**request, "messages": messages}, messages


class ResponsesShape:
    def offered(self, tool: Tool) -> dict[str, Any]:
        return {"type": "function", **_schema(tool)}

    def defined_name(self, tool: Any) -> str | None:
        name = tool.get("name") if isinstance(tool, dict) and tool.get("type") == "function" else None
        return name if isinstance(name, str) else None

    def conversation(self, request: dict[str, Any]) -> list[Any] | None:
        given = request.get("input")
        if isinstance(given, str):
            return [{"role": "user", "content": given}]
        return given if isinstance(given, list) else None

    def calls(self, body: dict[str, Any]) -> list[ToolCall]:
        output = body.get("output")
        if not isinstance(output, list):
            return []
        return [ToolCall(name=item["name"] if isinstance(item.get("name"), str) else None,
                         arguments=item.get("arguments"), call_id=item.get("call_id", ""))
                for item in output if isinstance(item, dict) and item.get("type") == "function_call"]

    def continued(self, request: dict[str, Any], conversation: list[Any], body: dict[str, Any],
                  calls: list[ToolCall], results: list[str]) -> tuple[dict[str, Any], list[Any]]:
        answers = [{"type": "function_call_output", "call_id": call.call_id, "output": result}
                   for call, result in zip(calls, results, strict=True)]
        items = [*conversation, *body["output"], *answers]
        return {**request, "input": items}, items


_SHAPES: dict[str, ToolShape] = {"/v1/chat/completions": ChatShape(), "/v1/responses": ResponsesShape()}


def shape_for(endpoint: str) -> ToolShape:
    """The shape of ``endpoint``'s tool calls; create refuses tool_config on any other (validation/tool_config)."""
    return _SHAPES[endpoint]


def _assistant_message(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    return message if isinstance(message, dict) else {}
