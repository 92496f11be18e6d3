"""Images against the REAL SGLang 0.5.23 on a CPU: a tiny random-weight Qwen3-VL (its own server: one start,
~80 s, and a one-time ~1 min warm-up at the first image) answers a geometry episode whose prompt holds an image
and whose plotting tool returns a figure, its turns constrained by a grammar. The real server must accept every
request (one pad per image, every image so far as ``image_data``) and count exactly the expanded prompt the
trajectory holds (``prompt_tokens``, ``image_tokens``); the trajectory invariants hold against what it saw."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from strands import Agent, tool
from vlm_kit import vl_checkpoint

from real_sglang.real_helpers import literal
from real_sglang.recording_proxy import RecordingProxy
from real_sglang.server_process import SGLangServerProcess
from real_sglang.server_setup import server_python
from real_sglang.tiny_vl_model import make_tiny_vl_model
from slime_strands import SGLangClient, SGLangModel
from slime_strands.testing.invariants import assert_trajectory_invariants

pytestmark = [pytest.mark.real_sglang, pytest.mark.timeout(900)]

CALL = '<tool_call>\n{"name": "plot", "arguments": {"expression": "x**2"}}\n</tool_call>'
THINK = "ok</think>\n\n"


@pytest.fixture(scope="module")
def vl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    tmp = tmp_path_factory.mktemp("real-sglang-vl")
    folder = make_tiny_vl_model(tmp / "tiny-qwen3-vl", "qwen3-vl")
    with SGLangServerProcess(server_python(), folder, tmp / "server.log") as server:
        yield folder, server.base_url


async def test_a_geometry_episode_with_images_on_the_real_server(vl_server):
    from vlm_kit import image_block, png

    folder, base_url = vl_server
    tokenizer, vision = vl_checkpoint(folder)
    greedy = {"max_new_tokens": 64, "temperature": 0.0}
    figure = png(64, 64, seed=7)

    with RecordingProxy(base_url) as proxy:
        model = SGLangModel(
            tokenizer=tokenizer,
            client=SGLangClient(proxy.base_url, retry_delay=0.05, max_retries=0),
            vision=vision,
            tool_parser="hermes",
            params={**greedy, "regex": literal(THINK + CALL)},
        )

        @tool
        def plot(expression: str) -> dict:
            """Plot an expression; returns the figure."""
            model.update_config(params={**greedy, "regex": literal(THINK + "x = 3")})  # then it answers
            return {
                "status": "success",
                "content": [{"text": "plotted"}, {"image": {"format": "png", "source": {"bytes": figure}}}],
            }

        agent = Agent(model=model, tools=[plot], callback_handler=None)
        await agent.invoke_async([image_block(png(100, 60, seed=6)), {"text": "Find x."}])
        exchanges = proxy.generations()
        tm = model.token_manager
        assert [e.status for e in exchanges] == [200, 200], [e.answer for e in exchanges]
        assert_trajectory_invariants(tm, proxy)

    assert [p.image.tokens for p in tm.images] == [77, 64]  # what the real server expanded (below)
    starts = [s.start for s in tm.spans if s.kind == "generated"]
    metas = [e.answer["meta_info"] for e in exchanges]
    assert [m["prompt_tokens"] for m in metas] == starts, (
        "the server's expanded prompt is not the trajectory's"
    )
    assert [m["image_tokens"] for m in metas] == [77, 77 + 64]
    assert [len(e.body["image_data"]) for e in exchanges] == [1, 2]
    texts = [e.answer["text"] for e in exchanges]
    assert texts[0].endswith(CALL) and texts[1].endswith("x = 3"), texts
    train = vision.train_inputs([p.image for p in tm.images])
    assert tuple(train["pixel_values"].shape) == (4 * (77 + 64), 1536)
