"""An MCP ``CallToolResult`` (the ``mcp`` package's own types) as the content of a Strands tool result."""

from __future__ import annotations

import base64
import types

import mcp_types as t
import pytest

from slime_strands.mcp_tools.results import tool_result_content

PNG = b"\x89PNG\r\n\x1a\nnot-really"


def result(*content: object, structured: object = None, error: bool = False) -> t.CallToolResult:
    return t.CallToolResult(content=list(content), structured_content=structured, is_error=error)


def test_text_images_and_resources_become_blocks_in_order():
    blocks, error = tool_result_content(
        result(
            t.TextContent(type="text", text="first"),
            t.ImageContent(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png"),
            t.EmbeddedResource(
                type="resource", resource=t.TextResourceContents(uri="file:///a.txt", text="inside")
            ),
            t.ResourceLink(type="resource_link", name="b", uri="file:///b.txt", description="the b file"),
            t.AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
        )
    )
    assert error is False
    assert blocks == [
        {"text": "first"},
        {"image": {"format": "png", "source": {"bytes": PNG}}},
        {"text": "inside"},
        {"text": "[resource file:///b.txt: the b file]"},
        {"text": "[audio the model cannot be shown]"},
    ]


def test_a_text_model_is_told_an_image_was_there():
    image = t.ImageContent(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png")
    assert tool_result_content(result(image), images=False)[0] == [
        {"text": "[an image (image/png): this model cannot be shown images]"}
    ]


def test_images_the_model_cannot_be_shown_are_named():
    svg = t.ImageContent(type="image", data="PHN2Zz4=", mime_type="image/svg+xml")
    broken = t.ImageContent(type="image", data="not base64!", mime_type="image/png")
    assert tool_result_content(result(svg, broken))[0] == [
        {"text": "[an image of type image/svg+xml the model cannot be shown]"},
        {"text": "[an image the server sent is not valid base64]"},
    ]


def test_structured_content_is_shown_only_without_content_blocks():
    assert tool_result_content(result(structured={"mean": 1.5})) == ([{"json": {"mean": 1.5}}], False)
    text = t.TextContent(type="text", text='{"mean": 1.5}')
    assert tool_result_content(result(text, structured={"mean": 1.5})) == ([{"text": '{"mean": 1.5}'}], False)


def test_an_error_result_is_an_error_and_an_empty_one_is_empty_text():
    assert tool_result_content(result(t.TextContent(type="text", text="boom"), error=True)) == (
        [{"text": "boom"}],
        True,
    )
    assert tool_result_content(result()) == ([{"text": ""}], False)


def test_a_malformed_result_is_a_value_error():
    with pytest.raises(ValueError, match="no content list"):
        tool_result_content(types.SimpleNamespace(content=None))
    with pytest.raises(ValueError, match="unknown MCP content type 'video'"):
        tool_result_content(types.SimpleNamespace(content=[types.SimpleNamespace(type="video")]))
