"""slime's args are parsed once per args object (issue 25): the ``strands:`` settings and
``--apply-chat-template-kwargs`` are read at the first sample, not at every sample and every reward call, and
read again when a flag is replaced. Every trajectory produced is checked against the server's records (``run``
does)."""

from __future__ import annotations

import pytest
from slime_helpers import Sample, make_args, new_sample, run, session_requests, slime_args

from slime_strands import reward
from slime_strands._slime import config as config_module
from slime_strands._slime.config import SlimeConfig
from slime_strands.errors import ConfigurationError
from slime_strands.settings import PluginSettings
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(120)

ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        yield srv


@pytest.fixture
def parses(monkeypatch) -> dict[str, int]:
    """How often the real parsing functions run (wrapped, not replaced)."""
    counts = {"settings": 0, "template_kwargs": 0}
    from_mapping = PluginSettings.from_mapping.__func__  # type: ignore[attr-defined]
    template_kwargs = config_module._template_kwargs

    def counted_settings(cls, data):
        counts["settings"] += 1
        return from_mapping(cls, data)

    def counted_template_kwargs(flag):
        counts["template_kwargs"] += 1
        return template_kwargs(flag)

    monkeypatch.setattr(PluginSettings, "from_mapping", classmethod(counted_settings))
    monkeypatch.setattr(config_module, "_template_kwargs", counted_template_kwargs)
    return counts


async def test_thirty_samples_and_their_rewards_parse_the_args_once(server, parses):
    args = make_args(
        server, strands={"enable_thinking": None}, apply_chat_template_kwargs='{"enable_thinking": false}'
    )
    for _ in range(30):
        sample = new_sample()
        out = await run(server, args, sample, ANSWER)
        assert out.status == Sample.Status.COMPLETED
        assert await reward.math_reward(args, out) == 1.0 and await reward.accuracy(args, out) == 1.0
        (request,) = session_requests(server, sample)
    assert parses == {"settings": 1, "template_kwargs": 1}
    # The flag reached the chat template: Qwen3's writes an empty think block when thinking is off.
    assert server.tokenizer.decode(request.body["input_ids"]).endswith("<think>\n\n</think>\n\n")
    args.strands = {"max_tool_iters": 3}  # a new mapping: read again
    assert SlimeConfig.of(args).settings.max_tool_iters == 3 and parses["settings"] == 2
    args.apply_chat_template_kwargs = '{"enable_thinking": true}'
    assert SlimeConfig.of(args).template_kwargs == {"enable_thinking": True}
    assert parses == {"settings": 3, "template_kwargs": 3}  # the config is read again as a whole


def test_a_config_is_per_args_object(parses):
    first, second = slime_args(strands={"max_tool_iters": 1}), slime_args(strands=None)
    assert SlimeConfig.of(first).settings.max_tool_iters == 1
    assert SlimeConfig.of(second).settings == PluginSettings()
    assert SlimeConfig.of(first) is SlimeConfig.of(first) and parses["settings"] == 2
    many = [slime_args(strands={"max_tool_iters": n}) for n in range(100)]
    assert [SlimeConfig.of(args).settings.max_tool_iters for args in many] == list(range(100))
    assert len(config_module._CONFIGS) <= config_module._KEPT, "a few kept, not one per args ever seen"
    first.strand = {"max_tool_iters": 2}  # an attribute added later is checked too
    with pytest.raises(ConfigurationError, match="did you mean 'strands'"):
        SlimeConfig.of(first)


def test_bad_args_raise_at_every_call_and_are_never_kept(parses):
    args = slime_args(strands={"max_tool_iters": 1}, apply_chat_template_kwargs="{oops")
    for _ in range(2):
        with pytest.raises(ConfigurationError, match="--apply-chat-template-kwargs is not JSON"):
            SlimeConfig.of(args)
    flagged = slime_args(strands=None, apply_chat_template=True)
    with pytest.raises(ConfigurationError, match="--apply-chat-template is set"):
        SlimeConfig.of(flagged)
    flagged.apply_chat_template = False
    assert SlimeConfig.of(flagged).settings == PluginSettings()


def test_args_without_attributes_of_their_own(parses):
    class Slotted:  # neither a __dict__ nor weak references
        __slots__ = ("strands",)

    args = Slotted()
    args.strands = {"max_tool_iters": 2}
    assert SlimeConfig.of(args).settings.max_tool_iters == 2 == SlimeConfig.of(args).settings.max_tool_iters
    assert parses["settings"] == 1
