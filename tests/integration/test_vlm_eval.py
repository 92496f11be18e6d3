"""``slime-strands eval`` and ``inspect`` on a vision-language model: a Geometry3K-shaped row (its figure as a
data URI, one ``<image>`` placeholder) and a tool that returns a figure. Each image is saved once in the
trajectory file, where its pads are; the terminal names the images and the HTML page shows them inline."""

from __future__ import annotations

import base64
import json

import pytest
from cli_helpers import call, check_row, error_line, eval_argv, read_rows, run_cli, write_config, write_data
from real_sglang.tiny_vl_model import make_tiny_vl_model
from vlm_kit import png, vl_checkpoint

from slime_strands.cli import main
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(120)


def test_eval_runs_an_image_dataset_and_inspect_shows_its_images(tmp_path, capsys):
    folder = make_tiny_vl_model(tmp_path / "qwen2.5-vl", "qwen2.5-vl")
    tokenizer, vision = vl_checkpoint(folder)
    figure_uri = "data:image/png;base64," + base64.b64encode(png(100, 60, seed=5)).decode()
    row = {"prompt": [{"role": "user", "content": "<image>Find x."}], "label": "3", "images": [figure_uri]}
    data = write_data(tmp_path / "geo3k.jsonl", [row])
    config = write_config(tmp_path / "plugin.yaml", tools=["rollout_tools.plot"], tool_parser="hermes")
    out = tmp_path / "traj.jsonl"
    with SGLangTestServer(tokenizer, vision=vision) as server:
        server.script(call("plot", expression="x"), "x = 3\nAnswer: \\boxed{3}", key="0:0")
        argv = eval_argv(server.base_url, data, "--n", "1", "--config", str(config), "--out", str(out))
        argv[argv.index("--tokenizer") + 1] = str(folder)
        assert main(argv) == 0, capsys.readouterr().err
        (saved,) = read_rows(out)
        check_row(saved, server)
    assert saved.reward == 1.0
    (segment,) = saved.segments
    assert [(i.tokens, i.data_uri == figure_uri) for i in segment.images] == [(8, True), (4, False)]
    line = out.read_text()
    assert line.count(figure_uri) == 1 and line.count("data:image/") == 2, "an image saved more than once"
    assert saved.prompt == row["prompt"]  # the row's prompt keeps its placeholder, not a copy of the image

    code, text, _ = run_cli(capsys, "inspect", str(out), "--index", "0:0", "--color", "never")
    assert code == 0 and "[image 1: 8 tokens]" in text and "[image 2: 4 tokens]" in text
    assert "<|image_pad|>" not in text  # a run of pads is one named cell
    page = tmp_path / "page.html"
    assert run_cli(capsys, "inspect", str(out), "--index", "0:0", "--html", str(page))[0] == 0
    html = page.read_text()
    assert html.count("<img class='img' src='data:image/png;base64,") == 2 and figure_uri in html
    assert "img-src data:" in html
    assert json.loads(line)["segments"][0]["images"][0]["start"] == segment.images[0].start


@pytest.mark.parametrize("room", [1, 0])
def test_the_prompt_check_counts_each_image_as_its_pads_to_the_token(tmp_path, capsys, room):
    """A row whose text is short and whose figure is large: with room for one generated token it runs (cut by
    the window), one token less is refused before any request, its line named with the expanded count."""
    folder = make_tiny_vl_model(tmp_path / "qwen2.5-vl", "qwen2.5-vl")
    tokenizer, vision = vl_checkpoint(folder)
    figure = png(560, 560, seed=6)
    pads = vision.tokens_of(560, 560)
    assert pads == 400  # (560 / 14)^2 patches over 2x2
    figure_uri = "data:image/png;base64," + base64.b64encode(figure).decode()
    row = {"prompt": [{"role": "user", "content": "<image>Find x."}], "label": "3", "images": [figure_uri]}
    data = write_data(tmp_path / "geo3k.jsonl", [row])
    config = write_config(tmp_path / "plugin.yaml", tools=["rollout_tools.plot"], tool_parser="hermes")
    text_only = len(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]}],
            tools=None,
            tokenize=True,
            add_generation_prompt=True,
        )
    )
    out = tmp_path / "traj.jsonl"
    with SGLangTestServer(tokenizer, vision=vision) as probe:  # the prompt as the episode holds it
        probe.script("x = 3", key="0:0")
        argv = eval_argv(probe.base_url, data, "--n", "1", "--config", str(config), "--out", str(out))
        argv[argv.index("--tokenizer") + 1] = str(folder)
        assert run_cli(capsys, *argv)[0] == 0
        (row,) = read_rows(out)
        check_row(row, probe)
        prompt = row.segments[0].spans[0]
        assert prompt.kind == "prompt"
        expanded = prompt.end - prompt.start
    assert expanded > pads > text_only, "the figure dominates the prompt"
    window = expanded + room
    out.unlink()
    with SGLangTestServer(tokenizer, vision=vision, context_length=window + 6) as server:
        server.script("x = 3", key="0:0")
        argv = eval_argv(server.base_url, data, "--n", "1", "--config", str(config), "--out", str(out))
        argv[argv.index("--tokenizer") + 1] = str(folder)
        code, _, stderr = run_cli(capsys, *argv)
        if room:
            assert code == 0, stderr
            (saved,) = read_rows(out)
            check_row(saved, server)
            assert saved.termination == "context_full" and len(saved.segments[0]) == window
        else:
            assert code == 2 and f"line 1 ({window} tokens)" in error_line(stderr, "eval")
            assert not server.generate_requests


def test_a_row_whose_image_cannot_be_read_is_named_before_any_request(tmp_path, capsys):
    folder = make_tiny_vl_model(tmp_path / "qwen2.5-vl", "qwen2.5-vl")
    tokenizer, vision = vl_checkpoint(folder)
    good = "data:image/png;base64," + base64.b64encode(png(32, 32)).decode()
    broken = "data:image/png;base64," + base64.b64encode(b"not a png").decode()
    rows = [
        {"prompt": [{"role": "user", "content": "<image>Find x."}], "label": "3", "images": [uri]}
        for uri in (good, broken)
    ]
    data = write_data(tmp_path / "geo3k.jsonl", rows)
    config = write_config(tmp_path / "plugin.yaml", tools=["rollout_tools.plot"], tool_parser="hermes")
    with SGLangTestServer(tokenizer, vision=vision) as server:
        argv = eval_argv(
            server.base_url, data, "--n", "1", "--config", str(config), "--out", str(tmp_path / "o")
        )
        argv[argv.index("--tokenizer") + 1] = str(folder)
        code, _, stderr = run_cli(capsys, *argv)
        assert code == 2, stderr
        line = error_line(stderr, "eval")
        assert (
            f"{data}: line 2: an image of the prompt is not an image file" in line and "BytesIO" not in line
        )
        assert not server.generate_requests
