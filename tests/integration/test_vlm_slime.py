"""slime's entry point on a vision-language model: a geometry sample whose prompt holds an image (as slime's
``--multimodal-keys`` builds it) and whose plotting tool returns a figure. The Sample carries the EXPANDED
tokens and exactly the images its tokens show, as slime's VLM trainer reads them; a FAILED sample too; a
partial-rollout checkpoint keeps the images."""

from __future__ import annotations

import base64

import pytest
from real_sglang.tiny_vl_model import VL_IDS, make_tiny_vl_model
from slime_helpers import Sample, make_args, new_sample, run
from vlm_kit import IMAGE_PAD, png, vl_checkpoint

from slime_strands.provider.checkpoint import (
    TrajectoryCheckpoint,
    checkpoint_reader,
    read_trajectory,
    trajectory_data,
)
from slime_strands.testing import Fault, SGLangTestServer, Turn
from slime_strands.testing.invariants import assert_sample_images, assert_trajectory_invariants

pytestmark = pytest.mark.timeout(120)

PROMPT_IMAGE = png(100, 60, seed=3)
CALL = '<tool_call>\n{"name": "plot", "arguments": {"expression": "x**2"}}\n</tool_call>'
PATCH_WIDTH = {"qwen2.5-vl": 3 * 2 * 14 * 14, "qwen3-vl": 3 * 2 * 16 * 16}


@pytest.fixture(params=["qwen2.5-vl", "qwen3-vl"])
def vl_model(request, tmp_path):
    folder = make_tiny_vl_model(tmp_path / request.param, request.param)
    tokenizer, vision = vl_checkpoint(folder)
    with SGLangTestServer(tokenizer, vision=vision) as server:
        yield request.param, folder, tokenizer, vision, server


def _sample():
    uri = "data:image/png;base64," + base64.b64encode(PROMPT_IMAGE).decode()
    return new_sample(
        [{"role": "user", "content": [{"type": "image", "image": uri}, {"type": "text", "text": "Find x."}]}]
    )


def _args(server, folder):
    return make_args(
        server, hf_checkpoint=str(folder), strands={"tools": ["rollout_tools.plot"], "tool_parser": "hermes"}
    )


async def test_the_sample_carries_the_expanded_tokens_and_its_images_for_the_trainer(vl_model):
    family, folder, _, vision, server = vl_model
    think = "ok</think>\n\n" if family == "qwen3-vl" else ""
    out = await run(server, _args(server, folder), _sample(), Turn(think + CALL), Turn(think + "x = 3"))
    assert out.status == Sample.Status.COMPLETED, out.metadata
    assert_sample_images(out, vision)
    images = out.multimodal_inputs["images"]
    assert [image.size for image in images] == [(100, 60), (64, 64)]  # the prompt's, then the tool's figure
    pixels, grid = out.multimodal_train_inputs["pixel_values"], out.multimodal_train_inputs["image_grid_thw"]
    assert pixels.shape[1] == PATCH_WIDTH[family]
    assert [int(g.prod()) // 4 for g in grid] == ([8, 4] if family == "qwen2.5-vl" else [77, 64])
    assert out.tokens.count(IMAGE_PAD) == sum(vision.tokens_of(*image.size) for image in images)
    loss_mask = out.loss_mask
    prompt_len = len(out.tokens) - out.response_length
    assert not any(m for t, m in zip(out.tokens[prompt_len:], loss_mask, strict=True) if t == IMAGE_PAD)
    sent = [r.body["image_data"] for r in server.generate_requests]
    assert [len(s) for s in sent] == [1, 2] and sent[1][0] == sent[0][0]


PLOT_CODE = (
    "import struct, zlib\n"
    "row = b'\\x00' + b'\\x10\\x80\\xf0' * 48\n"
    "chunk = lambda k, d: struct.pack('>I', len(d)) + k + d + struct.pack('>I', zlib.crc32(k + d))\n"
    "ihdr = struct.pack('>IIBBBBB', 48, 40, 8, 2, 0, 0, 0)\n"
    "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', ihdr) + chunk(b'IDAT', zlib.compress(row * 40)) + chunk(b'IEND', b'')\n"
    "open('triangle.png', 'wb').write(png)\n"
    "print('plotted')"
)


HOSTILE_FIGURES_CODE = PLOT_CODE.replace("print('plotted')", "") + (
    "open('bad.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + b'not a png at all')\n"
    "ihdr = lambda w, h: chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))\n"
    "head = lambda w, h: b'\\x89PNG\\r\\n\\x1a\\n' + ihdr(w, h)\n"
    "open('bomb.png', 'wb').write(head(30000, 30000) + chunk(b'IEND', b''))\n"
    "open('huge.png', 'wb').write(head(8000, 8000) + chunk(b'IEND', b''))\n"
    "print('plotted')"
)


@pytest.mark.parametrize("code", [PLOT_CODE, HOSTILE_FIGURES_CODE], ids=["plot", "hostile-figures"])
async def test_the_python_tool_shows_the_figure_the_code_saved_and_names_those_it_cannot(vl_model, code):
    """The geometry agent's plotting call: the sandbox's Python tool, ``sandbox.return_figures``, the figure
    the program saved reaches the model as an image and the sample as its second image. Model-written code is
    hostile: beside it, a .png that only starts like one, a decompression bomb (a header claiming 30000 x 30000),
    one of 8000 x 8000 pixels. Each becomes a line of the tool's output saying why and the episode goes on (a
    tool's failure, the model's to learn from, not a FAILED sample)."""
    import json

    family, folder, _, vision, server = vl_model
    think = "ok</think>\n\n" if family == "qwen3-vl" else ""
    call = (
        "<tool_call>\n"
        + json.dumps({"name": "execute_python_code", "arguments": {"code": code}})
        + "\n</tool_call>"
    )
    args = make_args(
        server,
        hf_checkpoint=str(folder),
        strands={
            "tools": ["slime_strands.sandbox.execute_python_code"],
            "tool_parser": "hermes",
            "sandbox": {"return_figures": True},
        },
    )
    out = await run(server, args, _sample(), Turn(think + call), Turn(think + "x = 3"))
    assert out.status == Sample.Status.COMPLETED, out.metadata
    assert_sample_images(out, vision)
    assert [image.size for image in out.multimodal_inputs["images"]] == [(100, 60), (48, 40)]
    tool_turn = server.generate_requests[1].body
    assert len(tool_turn["image_data"]) == 2
    shown = server.tokenizer.decode(tool_turn["input_ids"])
    assert shown.count("attached]") == 1 and "[figure triangle.png: attached]" in shown, shown
    if code == PLOT_CODE:
        assert "not shown: " not in shown
        return
    assert shown.count(" not shown: ") == 3 and "[image not shown" not in shown, shown
    assert "[figure bad.png not shown: the bytes are not a png image]" in shown
    assert "[figure bomb.png not shown: " in shown and "decompression bomb" in shown
    assert "send the file" not in shown, "no hint addressed to a tool's author"
    if family == "qwen2.5-vl":  # over 4 x the processor's largest area: refused before any decoding
        assert "[figure huge.png not shown: an image of 8000 x 8000 pixels is more than" in shown
    else:  # Qwen3-VL's largest area is 16.7 M pixels: 16384 pads, past the output's 4096 tokens
        assert (
            "[figure huge.png not shown: its 16384 tokens would take the output past the 4096 a tool output may "
            "hold" in shown
        )


@pytest.mark.parametrize("through", ["the data", "sandbox.return_figures"])
async def test_images_for_a_text_checkpoint_stop_the_run_at_the_first_sample(tokenizer, through):
    """Every episode would fail the same way: a configuration error, raised to slime at once (not one FAILED
    sample after another)."""
    from slime_strands.errors import ConfigurationError

    strands = (
        {"tools": ["slime_strands.sandbox.execute_python_code"], "sandbox": {"return_figures": True}}
        if through == "sandbox.return_figures"
        else {"tools": ["rollout_tools.plot"]}
    )
    sample = _sample() if through == "the data" else new_sample("Find x.")
    with SGLangTestServer(tokenizer) as server:
        with pytest.raises(ConfigurationError, match="no image processor"):
            await run(server, make_args(server, strands=strands), sample, Turn("x = 3"))
        assert not server.generate_requests


async def test_a_rich_image_entrys_max_and_min_pixels_size_what_the_server_and_the_trainer_see(vl_model):
    """slime passes rich entries (``{"type": "image", "image": ..., "max_pixels": ...}``, Qwen-VL's convention)
    through as they are: a 1000 x 1000 figure capped at 200 x 200 pixels, a 20 x 20 one raised to 100 x 100."""
    family, folder, _, vision, server = vl_model
    think = "ok</think>\n\n" if family == "qwen3-vl" else ""
    uris = ["data:image/png;base64," + base64.b64encode(png(n, n, seed=n)).decode() for n in (1000, 20)]
    content = [
        {"type": "image", "image": uris[0], "max_pixels": 200 * 200},
        {"type": "image", "image": uris[1], "min_pixels": 100 * 100},
        {"type": "text", "text": "Find x."},
    ]
    out = await run(
        server,
        _args(server, folder),
        new_sample([{"role": "user", "content": content}]),
        Turn(think + "x = 3"),
    )
    assert out.status == Sample.Status.COMPLETED, out.metadata
    assert [image.size for image in out.multimodal_inputs["images"]] == [(200, 200), (100, 100)]
    assert_sample_images(out, vision)
    assert server.meta_infos[server.generate_requests[0].body["rid"]]["image_tokens"] == sum(
        vision.tokens_of(n, n) for n in (200, 100)
    )


@pytest.mark.parametrize(
    "part",
    [
        {"type": "video", "video": "/data/clip.mp4"},
        {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
    ],
    ids=["video", "image_url"],
)
async def test_a_prompt_part_the_agent_cannot_show_fails_its_sample_by_name_never_silently_dropped(
    vl_model, part
):
    _, folder, _, _, server = vl_model
    content = [part, {"type": "text", "text": "Find x."}]
    out = await run(server, _args(server, folder), new_sample([{"role": "user", "content": content}]))
    assert out.status == Sample.Status.FAILED, out.metadata
    assert f"a prompt part of type {part['type']!r} cannot be shown" in out.metadata["strands"]["error"]
    assert not server.generate_requests


async def test_a_failed_sample_keeps_the_images_of_the_prompt_it_keeps(vl_model):
    _, folder, _, vision, server = vl_model
    args = _args(server, folder)
    args.strands["max_retries"] = 0
    out = await run(server, args, _sample(), Fault(status=500, body={"error": {"message": "boom"}}))
    assert out.status == Sample.Status.FAILED
    assert_sample_images(out, vision)
    assert len(out.multimodal_inputs["images"]) == 1 and out.multimodal_train_inputs[
        "image_grid_thw"
    ].shape == (1, 3)


@pytest.mark.parametrize("written", ["<|image_pad|>", "<|vision_start|>"])
@pytest.mark.parametrize("after", ["the answer", "a tool call"])
async def test_an_image_token_the_model_writes_fails_its_sample_before_the_server_or_the_trainer_sees_it(
    vl_model, after, written
):
    """An image token with no image behind it (a random-weight or drifting model can write one): a pad sent
    back makes SGLang count one placeholder more than the images; in a sample, a pad makes slime's VLM trainer
    count one image token more than the features, a ``<|vision_start|>`` that ends it makes its M-RoPE read
    past the sequence (either fails the step). They stop every turn; the sample is FAILED, masked."""
    family, folder, tokenizer, vision, server = vl_model
    think = "ok</think>\n\n" if family == "qwen3-vl" else ""
    tail = CALL if after == "a tool call" else "x = 3"
    token = tokenizer.convert_tokens_to_ids(written)
    assert token in (IMAGE_PAD, VL_IDS["vision_start_token_id"])
    ids = [
        *tokenizer.encode(think + "I draw ", add_special_tokens=False),
        token,
        *tokenizer.encode(tail, add_special_tokens=False),
    ]
    out = await run(server, _args(server, folder), _sample(), Turn(token_ids=ids))
    assert out.status == Sample.Status.FAILED and out.remove_sample, out.metadata
    assert written in out.metadata["strands"]["error"]
    (request,) = server.generate_requests  # nothing was sent after it
    assert set(VL_IDS.values()) - {VL_IDS["vision_token_id"]} <= set(
        request.body["sampling_params"]["stop_token_ids"]
    )
    assert_sample_images(out, vision)  # the prompt's image only: what the trainer can take
    assert list(out.tokens).count(IMAGE_PAD) == out.multimodal_train_inputs["image_grid_thw"].prod() // 4


async def test_a_checkpoint_of_an_image_trajectory_restores_it_exactly(vl_model):
    family, _, tokenizer, vision, server = vl_model
    from helpers import make_model
    from strands import Agent
    from vlm_kit import image_block

    think = "ok</think>\n\n" if family == "qwen3-vl" else ""
    server.script(Turn(think + CALL), Turn(think + "x = 3"))
    from rollout_tools import plot

    model = make_model(tokenizer, server, vision=vision, tool_parser="hermes")
    Agent(model=model, tools=[plot], callback_handler=None)([image_block(PROMPT_IMAGE), {"text": "Find x."}])
    tm = model.token_manager
    assert_trajectory_invariants(tm, server)
    saved = trajectory_data(TrajectoryCheckpoint.of(tm))
    rebuilt = read_trajectory(checkpoint_reader(saved, "trajectory")).rebuild()
    assert rebuilt.token_ids == tm.token_ids and rebuilt.images == tm.images and len(rebuilt.images) == 2
    assert rebuilt.wire_ids() == tm.wire_ids()


async def test_an_image_episode_aborted_by_slime_continues_with_its_images(vl_model, monkeypatch):
    """Partial rollout: slime aborts while the figure comes back; the ABORTED sample's checkpoint (plain JSON,
    the conversation's image bytes as base64) goes through slime's buffer and the episode goes on where it
    stopped, its images the same bytes."""
    import json
    import pickle

    import partial_tools
    from slime_helpers import install_generate_state

    from slime_strands import rollout
    from slime_strands._slime.partial_rollout import CHECKPOINT_KEY
    from slime_strands.testing.invariants import assert_sample_matches_server

    family, folder, tokenizer, vision, server = vl_model
    think = "ok</think>\n\n" if family == "qwen3-vl" else ""
    state = install_generate_state(monkeypatch, tokenizer)
    monkeypatch.setitem(partial_tools.FLAG, "state", state)
    call = CALL.replace('"plot"', '"plot_then_abort"')
    args = make_args(
        server,
        hf_checkpoint=str(folder),
        partial_rollout=True,
        strands={"tools": ["partial_tools.plot_then_abort"], "tool_parser": "hermes"},
    )
    sample = _sample()
    server.script(Turn(think + call), Turn(think + "x = 3"), key=sample.session_id)
    out = await rollout.generate(args, sample, {"max_new_tokens": 256})
    assert out.status == Sample.Status.ABORTED
    saved = out.metadata[CHECKPOINT_KEY]
    assert json.loads(json.dumps(saved)) == saved, "the checkpoint is plain JSON"
    state.aborted = False
    out = await rollout.generate(args, pickle.loads(pickle.dumps(out)), {"max_new_tokens": 256})
    assert out.status == Sample.Status.COMPLETED, out.metadata
    assert_sample_matches_server(out, server, routing_key=out.session_id)
    assert_sample_images(out, vision)
    assert [image.size for image in out.multimodal_inputs["images"]] == [(100, 60), (64, 64)]
    (continued,) = [r.body for r in server.generate_requests[1:]]
    assert continued["image_data"][0] == server.generate_requests[0].body["image_data"][0]
    assert len(continued["image_data"]) == 2


async def test_a_compacted_image_episode_fans_out_each_sample_with_its_own_images(tmp_path):
    """Fan-out: a sliding window rewrites the conversation of an episode whose tool returns a figure every turn;
    each segment is a sample holding exactly the images of its own tokens (the pinned prompt's figure re-rendered
    in every later segment), as slime's VLM trainer checks them."""
    folder = make_tiny_vl_model(tmp_path / "qwen2.5-vl", "qwen2.5-vl")
    tokenizer, vision = vl_checkpoint(folder)
    with SGLangTestServer(tokenizer, vision=vision, context_length=640) as server:
        args = make_args(
            server,
            hf_checkpoint=str(folder),
            strands={
                "tools": ["rollout_tools.plot"],
                "tool_parser": "hermes",
                "max_tool_iters": None,
                "context_management": "sliding_window",
            },
            custom_rm_path="slime_strands.reward.math_reward",
        )
        sample = _sample()
        server.script(*[Turn(CALL)] * 14, Turn("x = 3"), key=sample.session_id)
        from slime_strands import rollout

        out = await rollout.generate(args, sample, {"max_new_tokens": 4096})
    assert isinstance(out, list) and len(out) >= 2, [s.metadata["strands"] for s in out]
    assert all(s.status == Sample.Status.COMPLETED for s in out), [s.status for s in out]
    for segment in out:
        assert_sample_images(segment, vision)
        sizes = [image.size for image in segment.multimodal_inputs["images"]]
        assert sizes[0] == (100, 60) and set(sizes[1:]) <= {(64, 64)}, sizes
    counts = [len(s.multimodal_inputs["images"]) for s in out]
    assert sum(counts) > len(out) and max(counts) < 15, counts  # no sample holds the whole episode's figures
