"""What a result line answered, in words, for the record browser to show above the raw JSON: a chat message's
text (or the tools it called), a completion's text, a response's output text, an Anthropic message's text, or the
size of an embedding."""

from __future__ import annotations

from typing import Any

__all__ = ["answer_text"]


def answer_text(line: dict[str, Any]) -> str | None:
    """The answer of a success line for a person; None for an error line or a body of none of these shapes."""
    response = line.get("response")
    body = response.get("body") if isinstance(response, dict) else None
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("data"), list):
        return _embeddings(body["data"])
    if isinstance(body.get("choices"), list) and body["choices"]:
        return _choice(body["choices"][0])
    if isinstance(body.get("output"), list):
        return _response_output(body["output"])
    if body.get("type") == "message" and isinstance(body.get("content"), list):  # Anthropic's Messages API
        return _content_text(body["content"])
    return None


def _embeddings(data: list[Any]) -> str | None:
    vectors = [item.get("embedding") for item in data if isinstance(item, dict)]
    if not vectors:
        return None
    if all(isinstance(v, str) for v in vectors):
        return f"{_count(len(vectors), 'embedding')} in base64"
    sizes = sorted({len(v) for v in vectors if isinstance(v, list)})
    if not sizes:
        return None
    floats = " or ".join(str(size) for size in sizes)
    return f"{'embedding' if len(vectors) == 1 else _count(len(vectors), 'embedding')} of {floats} floats"


def _choice(choice: Any) -> str | None:
    if not isinstance(choice, dict):
        return None
    if isinstance(choice.get("text"), str):  # a text completion
        return choice["text"]
    message = choice.get("message")
    if not isinstance(message, dict):
        return None
    text = _content_text(message.get("content"))
    calls = [c.get("function") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    named = [f"{f.get('name')}({f.get('arguments') or ''})" for f in calls if isinstance(f, dict)]
    if named:
        text = "\n".join(([text] if text else []) + [f"calls {call}" for call in named])
    return text


def _response_output(output: list[Any]) -> str | None:
    parts = []
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            parts.append(_content_text(item.get("content")))
        elif item.get("type") == "function_call":
            parts.append(f"calls {item.get('name')}({item.get('arguments') or ''})")
    return "\n".join(p for p in parts if p) or None


def _content_text(content: Any) -> str:
    """A message's content: a string, or the text of its text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
