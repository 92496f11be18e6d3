"""``slime-strands eval`` and ``inspect`` on a vision-language model: a Geometry3K-shaped row (its figure as a
data URI, one ``<image>`` placeholder) and a tool that returns a figure. Each image is saved once in the
trajectory file, where its pads are; the terminal names the images and the HTML page shows them inline."""

from __future__ import annotations

import base64
import json

import pytest
from cli_helpers import call, check_row, eval_argv, read_rows, run_cli, write_config, write_data
from real_sglang.tiny_vl_model import make_tiny_vl_model
from transformers import AutoTokenizer
from vlm_kit import png

from slime_strands.cli import main
from slime_strands.provider.images import load_vision
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(120)


def test_eval_runs_an_image_dataset_and_inspect_shows_its_images(tmp_path, capsys):
    folder = make_tiny_vl_model(tmp_path / "qwen2.5-vl", "qwen2.5-vl")
    tokenizer, vision = AutoTokenizer.from_pretrained(str(folder)), load_vision(str(folder))
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
