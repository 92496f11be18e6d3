"""Bytes per image-turn: what an episode of a vision-language agent holds and sends for its images.

A geometry episode on Qwen3-VL (the real tokenizer and template, the real transformers image processor; the
stand-in server expanding images as SGLang 0.5.23 does): the prompt holds the problem's figure and every tool
call returns a new plot (``--size`` pixels, a plot-like PNG: lines on white). After ``--turns`` tool turns it
reports, per image: its PNG bytes; the bytes the trajectory holds for it (its data URI, held ONCE however many
turns follow: the same string object every request sends); the bytes each later turn's request carries for it
(SGLang needs every image of the conversation in every request); the bytes the trajectory file saves for it
(once, where its pads are); its expanded tokens; and the ``pixel_values`` slime's trainer gets for it (float32,
made once at the end). It checks that no turn copied an image (each image's data URI is one object across the
trajectory and every request body built from it).

    python benchmarks/bench_images.py                     # 8 tool turns, 640x480 plots
    python benchmarks/bench_images.py --turns 2 --size 128x96
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    0, os.path.join(ROOT, "tests")
)  # the tiny Qwen3-VL folder (tests/real_sglang/tiny_vl_model.py)


def _plot(width: int, height: int, seed: int) -> bytes:
    """A plot-like PNG: axes and a few polylines on white (compresses like a matplotlib figure)."""
    import random

    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.line([(20, height - 20), (width - 10, height - 20)], fill="black", width=2)
    draw.line([(20, 10), (20, height - 20)], fill="black", width=2)
    for color in ("blue", "red", "green"):
        points = [(x, rng.randint(15, height - 25)) for x in range(20, width - 10, max(1, width // 24))]
        draw.line(points, fill=color, width=2)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _episode(turns: int, size: tuple[int, int]) -> dict[str, Any]:
    from real_sglang.tiny_vl_model import make_tiny_vl_model
    from strands import Agent, tool
    from transformers import AutoTokenizer

    from slime_strands import SGLangClient, SGLangModel
    from slime_strands.provider.images import load_vision
    from slime_strands.testing import SGLangTestServer, Turn

    folder = make_tiny_vl_model(tempfile.mkdtemp(prefix="bench-images-"), "qwen3-vl")
    tokenizer, vision = AutoTokenizer.from_pretrained(str(folder)), load_vision(str(folder))
    plots = [_plot(*size, seed) for seed in range(turns + 1)]

    @tool
    def plot(expression: str) -> dict:
        """Plot an expression; returns the figure."""
        return {
            "status": "success",
            "content": [
                {"text": "plotted"},
                {"image": {"format": "png", "source": {"bytes": plots[next(counter)]}}},
            ],
        }

    counter = iter(range(1, turns + 1))
    call = '<tool_call>\n{"name": "plot", "arguments": {"expression": "x"}}\n</tool_call>'
    with SGLangTestServer(tokenizer, vision=vision, context_length=200_000) as server:
        server.script(*[Turn("ok</think>\n\n" + call)] * turns, Turn("ok</think>\n\nAnswer: \\boxed{3}"))
        model = SGLangModel(
            tokenizer=tokenizer,
            client=SGLangClient(server.base_url),
            vision=vision,
            tool_parser="hermes",
            params={"max_new_tokens": 64},
        )
        agent = Agent(model=model, tools=[plot], callback_handler=None)
        agent([{"image": {"format": "png", "source": {"bytes": plots[0]}}}, {"text": "Find x."}])
        bodies = [len(json.dumps(r.body)) for r in server.generate_requests]
        sent = [r.body.get("image_data", []) for r in server.generate_requests]
    tm = model.token_manager
    return {"tm": tm, "plots": plots, "bodies": bodies, "sent": sent, "vision": vision}


def _saved_bytes(tm: Any) -> int:
    """The trajectory file's images of the segment (what ``slime-strands eval --out`` writes for them)."""
    return len(
        json.dumps(
            [{"start": p.start, "tokens": p.image.tokens, "data_uri": p.image.data_uri} for p in tm.images]
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--turns", type=int, default=8, help="tool turns, each returning a new plot (default 8)"
    )
    parser.add_argument("--size", default="640x480", help="plot size WxH in pixels (default 640x480)")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    run = _episode(args.turns, (size[0], size[1]))
    tm, plots, vision = run["tm"], run["plots"], run["vision"]
    images = [p.image for p in tm.images]
    assert len(images) == args.turns + 1, f"{len(images)} images in the trajectory"
    # no copy per turn: each image is one string, the one the trajectory holds
    uris = {id(i.data_uri) for i in images}
    assert len(uris) == len(images), "an image is held twice"
    png = sum(len(p) for p in plots) / len(plots)
    held = sum(len(i.data_uri) for i in images) / len(images)
    requests = len(run["sent"])
    image_turns = sum(
        len(s) for s in run["sent"]
    )  # (image, request) pairs: each image resent every later turn
    sent_per_image_turn = sum(len(u) for s in run["sent"] for u in s) / image_turns
    train = vision.train_inputs(images)
    pixel_bytes = train["pixel_values"].numel() * 4 / len(images)
    tokens = sum(i.tokens for i in images) / len(images)
    print(
        f"{len(images)} images of {args.size} over {requests} requests ({image_turns} image-turns), Qwen3-VL"
    )
    print("| per image | bytes |")
    print("| --- | ---: |")
    print(f"| PNG | {png:,.0f} |")
    print(f"| held by the trajectory (data URI, once for the whole episode) | {held:,.0f} |")
    print(f"| in each later request (image_data) | {sent_per_image_turn:,.0f} |")
    print(f"| saved in the trajectory file (once) | {_saved_bytes(tm) / len(images):,.0f} |")
    print(f"| pixel_values for the trainer (float32, made once) | {pixel_bytes:,.0f} |")
    print(f"tokens per image: {tokens:,.0f}; request body of the last turn: {run['bodies'][-1]:,} bytes")
    naive = sum(len(i.data_uri) * (requests - k) for k, i in enumerate(images))
    print(f"held: {sum(len(i.data_uri) for i in images):,} bytes; a copy per turn would hold {naive:,}")


if __name__ == "__main__":
    main()
