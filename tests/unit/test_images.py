"""Images, piece by piece: the expansion arithmetic and its refusals, the trajectory's wire form, the stand-in's
SGLang 0.5.23 behaviour, slime's image prompts, and the template check of a vision-language model."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest
from vlm_kit import IMAGE_PAD, QWEN3_VL, QWEN25_VL, VL_FAMILIES, image_block, png, vl_tokenizer, vl_vision

from slime_strands import SGLangModel
from slime_strands.errors import InputError
from slime_strands.provider.images import ImagePlacement, image_bytes
from slime_strands.provider.images import image_block as block_of
from slime_strands.provider.token_manager import TokenManager, collapse_images
from slime_strands.template.chat_template import TemplateError
from slime_strands.template.render import ChatRenderer
from slime_strands.testing.sglang_images import ExpandedImages, expand_images

IMAGE = png(100, 60, seed=1)
URI = "data:image/png;base64," + base64.b64encode(IMAGE).decode()


@pytest.mark.parametrize(("family", "tokens"), [(QWEN25_VL, (8, 4, 1296)), (QWEN3_VL, (77, 64, 961))])
def test_tokens_per_image_are_what_the_real_server_expanded(family, tokens):
    # 100x60 and 64x64 as the real SGLang 0.5.23 counted them (docs/testing.md); 1000x1000 resized to a multiple
    # of patch * merge (1008 = 36 * 28: (1008 / 14)^2 / 4; 992 = 31 * 32: (992 / 16)^2 / 4)
    vision = vl_vision(family)
    assert (vision.tokens_of(100, 60), vision.tokens_of(64, 64), vision.tokens_of(1000, 1000)) == tokens


def test_expansion_replaces_each_pad_by_its_run_and_refuses_a_count_that_differs():
    vision = vl_vision(QWEN25_VL)
    image = vision.image(image_block(IMAGE)["image"])
    ids, starts = vision.expand([1, IMAGE_PAD, 2, IMAGE_PAD, 3], [image, image])
    assert ids == [1, *[IMAGE_PAD] * 8, 2, *[IMAGE_PAD] * 8, 3] and starts == [1, 10]
    with pytest.raises(InputError, match="rendered 2 image placeholder"):
        vision.expand([IMAGE_PAD, IMAGE_PAD], [image])


def test_the_trajectory_holds_expanded_ids_and_sends_one_pad_per_image():
    vision = vl_vision(QWEN25_VL)
    image = vision.image(image_block(IMAGE)["image"])
    tm = TokenManager()
    tm.add_prompt([5, *[IMAGE_PAD] * 8, 6], [ImagePlacement(1, image)])
    tm.add_generation([7], [-0.5], __import__("slime_strands").provider.token_manager.TurnInfo("stop"))
    assert tm.wire_ids() == [5, IMAGE_PAD, 6, 7] and tm.wire_length == 4 and len(tm) == 11
    assert tm.images_before(9) == [image] and tm.images_before(8) == []
    assert collapse_images(tm.token_ids, tm.images) == tm.wire_ids()
    with pytest.raises(ValueError, match="outside"):
        tm.add_observation([1, 2], [ImagePlacement(1, image)])


def test_a_bad_image_is_one_clear_line():
    vision = vl_vision(QWEN25_VL)
    with pytest.raises(InputError, match="not a png image"):
        vision.image({"format": "png", "source": {"bytes": b"not an image"}})
    with pytest.raises(InputError, match="needs a format"):
        vision.image({"format": "bmp", "source": {"bytes": IMAGE}})
    with pytest.raises(InputError, match="more than 51,380,224 pixels"):
        vision.image(image_block(_huge_png())["image"])  # a few kB claiming 8,000 x 8,000 pixels
    with pytest.raises(InputError, match="data URI, base64 or an absolute path"):
        image_bytes("images/x.png")
    with pytest.raises(InputError, match="max_pixels must be a positive integer, got 0"):
        block_of(URI, max_pixels=0)
    assert block_of(URI, max_pixels=100 * 60, min_pixels=1) == block_of(URI)  # within: the bytes as they are


def _huge_png() -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 8000, 8000, 8, 0, 0, 0, 0)  # grey, never decoded: only its size is read
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )


def test_a_tool_outputs_images_are_shown_while_their_pads_fit_its_limit():
    """Qwen2.5-VL: a 100 x 60 figure is 8 pads, a 1000 x 1000 one 1296. With 1304 tokens per output, the first
    small one and the large one fit, the second small one would pass the limit; with 1300 the large one would,
    and both small ones are shown. A user's image is never touched, and an output left without images is plain
    text again (cut like any)."""
    from slime_strands.provider.model_stats import ModelStats
    from slime_strands.provider.tool_output import ToolOutputFitter

    vision = vl_vision(QWEN25_VL)
    small, large = image_block(IMAGE)["image"], image_block(png(1000, 1000))["image"]
    messages = [
        {"role": "user", "content": [{"type": "image", "image": large}, {"type": "text", "text": "Find x."}]},
        {"role": "tool", "content": [{"type": "text", "text": "plotted"}, *_images(small, large, small)]},
        {
            "role": "tool",
            "content": [{"type": "text", "text": "bad"}, *_images({"format": "png", "source": {}})],
        },
    ]
    stats = ModelStats()
    fitter = ToolOutputFitter(ChatRenderer(vl_tokenizer(QWEN25_VL)), {"max_tool_output_tokens": 1304})
    fitter.fit_image_outputs(messages, vision, stats)
    assert messages[0]["content"][0]["image"] is large
    kinds = [part["type"] for part in messages[1]["content"]]
    assert kinds == ["text", "image", "image", "text"] and stats.tool_outputs_truncated == 1
    assert (
        "its 8 tokens would take the output past the 1304 a tool output may hold"
        in messages[1]["content"][3]["text"]
    )
    assert messages[2]["content"].startswith("bad\n\n[image not shown: an image block needs a format")
    tighter = [{"role": "tool", "content": _images(small, large, small)}]
    ToolOutputFitter(
        ChatRenderer(vl_tokenizer(QWEN25_VL)), {"max_tool_output_tokens": 1300}
    ).fit_image_outputs(tighter, vision, None)
    assert [part["type"] for part in tighter[0]["content"]] == ["image", "text", "image"]
    assert "its 1296 tokens would take" in tighter[0]["content"][1]["text"]
    unlimited = [{"role": "tool", "content": _images(small, large, small)}]
    ToolOutputFitter(
        ChatRenderer(vl_tokenizer(QWEN25_VL)), {"max_tool_output_tokens": None}
    ).fit_image_outputs(unlimited, vision, None)
    assert [part["type"] for part in unlimited[0]["content"]] == ["image"] * 3


def test_the_text_beside_a_tool_outputs_images_is_cut_to_what_they_leave():
    """A 1,296-pad figure and ~8,000 tokens of text in an output of at most 1,400 tokens: the figure is shown,
    the text cut (head + tail around the marker) to the 104 tokens it leaves; a refused image's line is kept
    whole."""
    from slime_strands.provider.model_stats import ModelStats
    from slime_strands.provider.tool_output import ToolOutputFitter

    vision, tokenizer = vl_vision(QWEN25_VL), vl_tokenizer(QWEN25_VL)
    large = image_block(png(1000, 1000))["image"]
    text = " ".join(str(i % 97) for i in range(4000))
    message = {"role": "tool", "content": [{"type": "text", "text": text}, *_images(large, large)]}
    stats = ModelStats()
    ToolOutputFitter(ChatRenderer(tokenizer), {"max_tool_output_tokens": 1400}).fit_image_outputs(
        [message], vision, stats
    )
    cut, shown, refused = message["content"]
    assert shown["type"] == "image" and refused["text"].startswith("\n[image not shown: its 1296 tokens")
    assert "tokens of tool output truncated" in cut["text"] and cut["text"].startswith("0 1 2")
    assert len(tokenizer.encode(cut["text"], add_special_tokens=False)) <= 104 + 2
    assert stats.tool_outputs_truncated == 2  # the refused image, the cut text


def _images(*blocks):
    return [{"type": "image", "image": block} for block in blocks]


def _jpeg(width: int = 40, height: int = 30) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, format="JPEG")
    return out.getvalue()


def test_a_jpeg_as_a_data_uri_or_raw_base64_is_read_as_base64_not_as_a_path(tmp_path):
    """A JPEG's base64 starts ``/9j/``, an absolute path's shape: it was opened as a file and every JPEG sample
    FAILED. A data URI's payload is base64 whatever it looks like; a bare string is a file only where one is;
    the data_prep reader agrees."""
    from data_prep.images import image_uri

    data = _jpeg()
    encoded = base64.b64encode(data).decode()
    assert encoded.startswith("/9j/")
    uri = "data:image/jpeg;base64," + encoded
    assert image_bytes(uri) == image_bytes(encoded) == data
    assert block_of(uri) == {"format": "jpeg", "source": {"bytes": data}}
    image = vl_vision(QWEN25_VL).image(block_of(encoded))
    assert image.pil().size == (40, 30) and image_bytes(image.data_uri) == data
    assert image_uri(encoded) == uri
    path = tmp_path / "figure.jpg"
    path.write_bytes(data)
    assert image_bytes(str(path)) == image_bytes(f"file://{path}") == data
    with pytest.raises(InputError, match="no file there, and not base64"):
        image_bytes(str(tmp_path / "missing.png"))


def test_an_image_the_processor_refuses_is_one_clear_line_and_a_tool_outputs_line():
    """Qwen's processor refuses an aspect ratio over 200 with a bare ValueError: an image block says why, and a
    tool output's figure is named as not shown (the episode goes on), never a failed episode."""
    from slime_strands.provider.tool_output import ToolOutputFitter

    vision = vl_vision(QWEN3_VL)
    strip = image_block(png(1000, 4))["image"]
    with pytest.raises(InputError, match=r"1000 x 4 pixels cannot be processed .*aspect ratio"):
        vision.image(strip)
    message = {"role": "tool", "content": [{"type": "text", "text": "plotted"}, *_images(strip)]}
    ToolOutputFitter(
        ChatRenderer(vl_tokenizer(QWEN3_VL)), {"max_tool_output_tokens": 4096}
    ).fit_image_outputs([message], vision, None)
    assert message["content"].startswith("plotted\n\n[image not shown: an image of 1000 x 4 pixels cannot be")


def test_slime_image_references_become_strands_image_blocks(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(IMAGE)
    for reference in (URI, URI.partition(",")[2], str(path), f"file://{path}"):
        assert block_of(reference) == {"format": "png", "source": {"bytes": IMAGE}}


def _body(ids, images):
    return {"input_ids": ids, "image_data": images, "sampling_params": {}}


def test_the_stand_in_expands_and_refuses_as_sglang_does():
    vision = vl_vision(QWEN25_VL)
    ok = expand_images(_body([1, 151652, IMAGE_PAD, 151653, 2], [URI]), vision)
    assert ok == ExpandedImages([1, 151652, *[IMAGE_PAD] * 8, 151653, 2], 8)
    assert expand_images({"input_ids": [1, IMAGE_PAD]}, vision) == ExpandedImages([1, IMAGE_PAD], 0)
    assert expand_images(_body([IMAGE_PAD, 9, IMAGE_PAD], [URI]), vision) == (
        400,
        "Prompt has 2 image placeholders but 1 image inputs were provided",
    )
    assert "hangs" in expand_images(_body([*[IMAGE_PAD] * 8], [URI]), vision)
    assert "silently ignores" in expand_images(_body([IMAGE_PAD], [URI, URI]), vision)
    assert "text model" in expand_images(_body([IMAGE_PAD], [URI]), None)


@pytest.mark.parametrize("family", VL_FAMILIES, ids=lambda f: f.name)
def test_the_template_check_refuses_images_numbered_across_the_conversation(family):
    tokenizer = vl_tokenizer(family)
    SGLangModel(
        tokenizer=tokenizer, base_url="http://127.0.0.1:9", vision=vl_vision(family), tool_parser="hermes"
    )
    with pytest.raises(TemplateError, match="add_vision_id"):
        SGLangModel(
            tokenizer=tokenizer,
            base_url="http://127.0.0.1:9",
            vision=vl_vision(family),
            tool_parser="hermes",
            chat_template_kwargs={"add_vision_id": True},
        )


def test_the_template_check_refuses_a_text_template_for_a_vision_model(tokenizer):
    with pytest.raises(TemplateError, match="cannot render images"):
        ChatRenderer(tokenizer).check_images("<|image_pad|>")


def test_a_figures_line_names_its_file_and_says_attached_only_when_shown():
    """A run saved plot.png, bad.png (PNG's signature, then garbage) and huge.png (a header of 8000 x 8000):
    the model reads `attached` beside the one figure it is shown, and for each other one a line naming the file
    and the reason, in words addressed to it (no hint for a tool's author)."""
    from slime_strands.provider.tool_output import FIGURE_NAME_KEY, ToolOutputFitter

    def figure(name: str, data: bytes) -> dict:
        return {**image_block(data)["image"], FIGURE_NAME_KEY: name}

    header = b"IHDR" + struct.pack(">IIBBBBB", 8000, 8000, 8, 2, 0, 0, 0)  # a header only: no pixel data
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    huge = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + header + struct.pack(">I", zlib.crc32(header)) + end
    plot, bad = figure("plot.png", png(40, 30)), figure("bad.png", b"\x89PNG\r\n\x1a\n" + b"not a png at all")
    message = {
        "role": "tool",
        "content": [{"type": "text", "text": "plotted"}, *_images(plot, bad, figure("huge.png", huge))],
    }
    shown = ToolOutputFitter(
        ChatRenderer(vl_tokenizer(QWEN25_VL)), {"max_tool_output_tokens": 4096}
    ).fit_image_outputs([message], vl_vision(QWEN25_VL), None)
    assert list(shown) == [id(plot)]
    parts = message["content"]
    assert [p["type"] for p in parts] == ["text", "text", "image", "text", "text"]
    assert parts[1]["text"] == "\n[figure plot.png: attached]" and parts[2]["image"] is plot
    assert parts[3]["text"].startswith("\n[figure bad.png not shown: the bytes are not a png image")
    assert parts[4]["text"].startswith("\n[figure huge.png not shown: an image of 8000 x 8000 pixels")
    texts = " ".join(p["text"] for p in parts if p["type"] == "text")
    assert texts.count("attached") == 1 and "send the file" not in texts and "image not shown" not in texts
