"""Trajectory invariants (docs: architecture.md), checked on every trajectory a test produces.

``assert_trajectory_invariants(token_manager, server, tokenizer)`` raises AssertionError naming the first
broken invariant. Usable by users on their own rollouts against :class:`SGLangTestServer`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..provider.token_manager import TokenManager, collapse_images
from .server import RecordedRequest, SGLangTestServer
from .sglang_images import ExpandedImages, expand_images, pad_runs

__all__ = [
    "assert_batch_convertible",
    "assert_sample_invariants",
    "assert_sample_matches_server",
    "assert_trajectory_invariants",
]


def assert_trajectory_invariants(
    tm: TokenManager,
    server: SGLangTestServer | None = None,
    *,
    routing_key: str | None = None,
    requests: Sequence[RecordedRequest] | None = None,
) -> None:
    """Check invariants 1-3 and 6 of a TokenManager against what the server saw and answered.

    1. ``token_ids`` is the concatenation of the spans; ``spans[0]`` is the prompt.
    2. ``loss_mask`` is 1 exactly on generated spans; logprobs are 0.0 elsewhere; lengths agree.
    3. Every /generate request's ``input_ids`` equals the trajectory up to that turn (each image one pad, its
       ``image_data`` the trajectory's images so far, in order, and the request expanded as SGLang expands it is
       the trajectory), and each generated span is byte-for-byte the ``output_ids`` (and logprobs) the server
       answered.
    6. The trajectory ends on a generated span (or is just the prompt): no half-appended turn.
    """
    _assert_layout(tm)
    if server is None and requests is None:
        return
    if requests is None:
        assert server is not None
        requests = [
            r
            for r in server.generate_requests
            if routing_key is None or r.headers.get("x-smg-routing-key") == routing_key
        ]
    _assert_requests(tm, requests, server)


def _assert_layout(tm: TokenManager) -> None:
    """Invariants 1, 2 and 6: the spans tile the trajectory, the prompt first; mask and logprobs follow them."""
    ids, mask, logprobs, spans = tm.token_ids, tm.loss_mask, tm.logprobs, tm.spans
    assert len(ids) == len(mask) == len(logprobs), "token_ids / loss_mask / logprobs lengths differ"
    if not spans:
        assert not ids, "tokens without spans"
        return
    assert spans[0].kind == "prompt" and spans[0].start == 0, "spans[0] must be the prompt"
    assert all(s.kind != "prompt" for s in spans[1:]), "only spans[0] may be a prompt"
    position = 0
    for span in spans:
        assert span.start == position, f"span at {span.start} does not follow position {position}"
        assert ids[span.start : span.end] == list(span.token_ids), "token_ids != concat(spans)"
        expected_mask = 1 if span.kind == "generated" else 0
        assert all(m == expected_mask for m in mask[span.start : span.end]), f"loss_mask wrong in {span.kind}"
        if span.kind != "generated":
            assert all(lp == 0.0 for lp in logprobs[span.start : span.end]), "logprob != 0.0 off-policy"
        position = span.end
    assert position == len(ids), "spans do not cover the trajectory"
    assert spans[-1].kind in ("generated", "prompt"), "trajectory ends on non-generated tokens (half turn)"
    for a, b in itertools.pairwise(spans):
        assert not (a.kind == "observation" and b.kind == "observation"), "two observations in a row"


def _assert_requests(
    tm: TokenManager, requests: Sequence[RecordedRequest], server: SGLangTestServer | None
) -> None:
    """Invariant 3: each generated span was asked with the trajectory before it and is what the server sent."""
    ids, logprobs = tm.token_ids, tm.logprobs
    generated = [s for s in tm.spans if s.kind == "generated"]
    # Requests answered with tokens map one-to-one onto generated spans, in order.
    answered = [r for r in _kept(requests, server) if r.body and _answered(r, server)]
    assert len(answered) >= len(generated), (
        f"{len(generated)} generated spans but {len(answered)} answered requests"
    )
    for span, request in zip(generated, answered, strict=False):
        sent = request.body["input_ids"]
        images = [p for p in tm.images if p.end <= span.start]
        assert sent == collapse_images(ids[: span.start], images), (
            f"request input_ids ({len(sent)} tokens) != trajectory before the turn ({span.start} tokens"
            f"{f', {len(images)} image(s) one pad each' if images else ''})"
        )
        assert request.body.get("image_data", []) == [p.image.data_uri for p in images], (
            "image_data != the trajectory's images before the turn, in order, each once"
        )
        assert _expanded(request, server) in (None, ids[: span.start]), (
            "the request, expanded as SGLang expands its images, is not the trajectory before the turn"
        )
        assert request.body["logprob_start_len"] == span.start - 1, (
            "logprob_start_len must be the expanded prompt's length - 1"
        )
        answer = _answer_for(server, request)
        if answer is not None:
            out_ids, out_lps = answer
            assert list(span.token_ids) == out_ids, "generated span != server output_ids"
            assert logprobs[span.start : span.end] == out_lps, "logprobs != server output_token_logprobs"


def assert_sample_invariants(sample: Any, tm: TokenManager | None = None, *, masked_before: int = 0) -> None:
    """Invariant 5 (slime's view): lengths, response slice, and agreement with the TokenManager if given.

    ``masked_before``: response positions an older policy wrote before a continuation that
    ``--mask-offpolicy-in-partial-rollout`` took out of the loss (loss mask 0, logprobs kept as sampled)."""
    n = sample.response_length
    assert len(sample.tokens) >= n, "response_length exceeds tokens"
    assert len(sample.loss_mask) == n, f"len(loss_mask)={len(sample.loss_mask)} != response_length={n}"
    assert len(sample.rollout_log_probs) == n, (
        f"len(rollout_log_probs)={len(sample.rollout_log_probs)} != {n}"
    )
    assert all(m in (0, 1) for m in sample.loss_mask), "loss_mask values must be 0/1"
    for i, (m, lp) in enumerate(zip(sample.loss_mask, sample.rollout_log_probs, strict=True)):
        assert m == 1 or lp == 0.0 or i < masked_before, "masked positions must carry logprob 0.0"
    if tm is not None and len(tm):
        prompt_len = tm.prompt_length
        assert sample.tokens == tm.token_ids, "sample.tokens != trajectory"
        assert len(sample.tokens) == prompt_len + n, "len(tokens) != prompt_len + response_length"
        expected = tm.loss_mask[prompt_len:]
        expected[:masked_before] = [0] * min(masked_before, len(expected))
        assert sample.loss_mask == expected, "loss_mask != trajectory mask after the prompt"
        assert sample.rollout_log_probs == tm.logprobs[prompt_len:], (
            "rollout_log_probs != trajectory logprobs"
        )


def _kept(requests: Sequence[RecordedRequest], server: SGLangTestServer | None) -> list[RecordedRequest]:
    """The requests whose answers can be in the trajectory: one whose input the client sent again later was
    superseded (a turn the server aborted on its own and was retried, or a sub-agent whose tool call slime's
    abort killed and that ran again when its episode continued)."""
    kept = []
    for i, request in enumerate(requests):
        sent_again = any(
            later.body and later.body.get("input_ids") == request.body.get("input_ids")
            for later in requests[i + 1 :]
        )
        if not sent_again:
            kept.append(request)
    return kept


def _expanded(request: RecordedRequest, server: SGLangTestServer | None) -> list[int] | None:
    """The request's ids as the server's model saw them (images expanded), None without a server to ask."""
    vision = getattr(server, "vision", None)  # a recording proxy in front of the real server has none
    if server is None or (vision is None and "image_data" in request.body):
        return None
    expanded = expand_images(request.body, vision)
    assert isinstance(expanded, ExpandedImages), (
        f"the server could not expand the request's images: {expanded}"
    )
    return expanded.input_ids


def _answered(request: RecordedRequest, server: SGLangTestServer | None) -> bool:
    if server is None:
        return True
    return request.body.get("rid") in server.answers


def _answer_for(
    server: SGLangTestServer | None, request: RecordedRequest
) -> tuple[list[int], list[float]] | None:
    if server is None:
        return None
    return server.answers.get(request.body.get("rid"))


def assert_sample_matches_server(
    sample: Any,
    server: SGLangTestServer,
    *,
    routing_key: str | None = None,
    masked_before: int = 0,
    requests: Sequence[RecordedRequest] | None = None,
) -> None:
    """Invariants 1-3 and 5-6 from slime's side: rebuild the expected mask and logprobs from what the server
    saw and answered, and compare with the Sample (for rollouts whose TokenManager is not at hand). A sample
    continued after an abort is checked across the seam (the turn the abort cut is two answers);
    ``masked_before`` as in :func:`assert_sample_invariants`; ``requests``: the sample's own requests, when
    the routing key's requests hold several samples (an episode's trajectory segments)."""
    assert_sample_invariants(sample, masked_before=masked_before)
    tokens = list(sample.tokens)
    prompt_len = len(tokens) - sample.response_length
    expected_mask = [0] * len(tokens)
    expected_lps = [0.0] * len(tokens)
    last_end = prompt_len
    if requests is None:
        requests = [
            r
            for r in server.generate_requests
            if routing_key is None or r.headers.get("x-smg-routing-key") == routing_key
        ]
    for request in _kept(requests, server):
        answer = server.answers.get(request.body.get("rid"))
        if answer is None:
            continue
        sent = _expanded(request, server) or request.body["input_ids"]
        out_ids, out_lps = answer
        start = len(sent)
        assert start >= last_end, "a request did not extend the trajectory"
        assert tokens[:start] == sent, f"request input_ids ({start} tokens) are not the trajectory so far"
        assert tokens[start : start + len(out_ids)] == out_ids, "server output_ids are not in the trajectory"
        expected_mask[start : start + len(out_ids)] = [1] * len(out_ids)
        expected_lps[start : start + len(out_ids)] = out_lps
        last_end = start + len(out_ids)
    expected_mask[prompt_len : prompt_len + masked_before] = [0] * masked_before
    assert sample.loss_mask == expected_mask[prompt_len:], (
        "loss_mask is not 1 exactly on server-generated tokens"
    )
    assert sample.rollout_log_probs == expected_lps[prompt_len:], "rollout_log_probs != server logprobs"
    if sample.response_length and not getattr(sample, "remove_sample", False):
        assert last_end == len(tokens), "the trajectory does not end on a model output"


def assert_batch_convertible(samples: Sequence[Any], args: Any) -> None:
    """What slime's trainer checks when it turns a batch of samples into training data (slime main:
    ``RolloutManager._convert_samples_to_train_data``, ``validate_rollout_routed_experts_for_replay``,
    ``prepare_routed_experts_for_routing_replay``): one sample lacking a field the batch carries crashes the
    step. ``args`` needs ``rollout_top_p``, ``use_rollout_routing_replay`` (and then ``num_layers``,
    ``moe_router_topk``)."""
    assert samples, "empty batch"
    for i, sample in enumerate(samples):
        n = sample.response_length
        assert sample.loss_mask is None or len(sample.loss_mask) == n, f"sample {i}: loss mask length"
        assert len(sample.tokens) > n > 0, f"sample {i}: tokens must hold a prompt and a response"
    if samples[0].rollout_log_probs is not None:
        for i, sample in enumerate(samples):
            assert sample.rollout_log_probs is not None, (
                f"sample {i}: no rollout_log_probs in a batch that has them"
            )
            assert len(sample.rollout_log_probs) == sample.response_length, f"sample {i}: logprobs length"
    if getattr(args, "rollout_top_p", 1.0) != 1.0:
        for i, sample in enumerate(samples):
            ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
            assert ids is not None and offsets is not None, f"sample {i}: no top-p replay spans"
            assert len(offsets) == sample.response_length + 1, f"sample {i}: top-p offsets length"
            assert int(offsets[-1]) == len(ids), f"sample {i}: top-p offsets[-1] != len(ids)"
    if samples[0].rollout_routed_experts is not None or getattr(args, "use_rollout_routing_replay", False):
        layers, topk = int(args.num_layers), int(args.moe_router_topk)
        for i, sample in enumerate(samples):
            assert sample.rollout_routed_experts is not None, f"sample {i}: no routed experts"
            experts = np.asarray(sample.rollout_routed_experts)
            assert experts.ndim == 3 and experts.shape[1:] == (layers, topk), (
                f"sample {i}: shape {experts.shape}"
            )
            assert experts.shape[0] == len(sample.tokens) - 1, f"sample {i}: {experts.shape[0]} routing rows"
            if topk > 1:
                dead = [layer for layer in range(layers) if not np.count_nonzero(experts[:, layer, :])]
                assert not dead, f"sample {i}: all-zero routing for layers {dead}"


def assert_sample_images(sample: Any, vision: Any) -> None:
    """What slime's VLM trainer checks of a sample's images (slime 624b824a, ``slime_plugins/models/
    qwen3_5_vl*.py``: every run of image pads starts after ``<|vision_start|>`` and takes the next grid in
    order, ``grid_t * grid_h * grid_w // merge**2`` pads long; pads and vision features agree in number; no grid
    unused), and that ``multimodal_inputs`` holds the same images: ``vision`` is the model's
    :class:`~slime_strands.provider.images.Vision`."""
    tokens = list(sample.tokens)
    runs = pad_runs(tokens, vision.image_token_id)
    inputs, train = sample.multimodal_inputs, sample.multimodal_train_inputs
    if not runs:
        assert not (inputs and inputs.get("images")) and train is None, (
            "images for a sample with no image pads"
        )
        return
    assert inputs is not None and inputs.get("videos") is None, (
        "multimodal_inputs must be {'images', 'videos'}"
    )
    assert len(inputs["images"]) == len(runs), f"{len(inputs['images'])} images for {len(runs)} runs of pads"
    assert train is not None and set(train) == {"pixel_values", "image_grid_thw"}, (
        "multimodal_train_inputs keys"
    )
    grid = np.asarray(train["image_grid_thw"])
    pixels = np.asarray(train["pixel_values"])
    assert grid.dtype == np.int64 and grid.shape == (len(runs), 3), (
        f"image_grid_thw {grid.dtype} {grid.shape}"
    )
    assert pixels.dtype == np.float32 and pixels.shape[0] == int(grid.prod(axis=1).sum()), "pixel_values rows"
    merge = vision.merge_size**2
    for (start, length), thw in zip(runs, grid.tolist(), strict=True):
        assert start > 0 and tokens[start - 1] == vision.vision_start_id, "a run of pads without vision_start"
        assert length == thw[0] * thw[1] * thw[2] // merge, f"a run of {length} pads for grid {thw}"
