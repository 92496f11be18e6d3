"""Sampling params through slime's generate(): the plugin settings' ``sampling_params`` merged over slime's,
every key SGLang accepts passed, none dropped (issue 24.2 and 24.3). Every trajectory produced is checked
against the server's records (``run`` does)."""

from __future__ import annotations

import pytest
from slime_helpers import CALL_ADD, SLIME_PARAMS, Sample, make_args, new_sample, record, run, session_requests

from slime_strands import rollout
from slime_strands.agent.record import Termination
from slime_strands.errors import ConfigurationError
from slime_strands.testing import SGLangTestServer

pytestmark = pytest.mark.timeout(90)

ANSWER = "The sum is 5.\nAnswer: \\boxed{5}"
GRAMMAR = {
    "regex": "(.|\\n)*",
    "top_k": 20,
    "min_p": 0.05,
    "stop": ["</answer>"],
    "logit_bias": {"151643": -100.0},
}


@pytest.fixture
def server(tokenizer):
    with SGLangTestServer(tokenizer, context_length=8192) as srv:
        yield srv


async def test_the_settings_sampling_params_reach_every_turn_over_slimes(server):
    sample = new_sample()
    out = await run(server, make_args(server, strands={"sampling_params": GRAMMAR}), sample, CALL_ADD, ANSWER)
    assert out.status == Sample.Status.COMPLETED and record(out).termination is Termination.END_TURN
    requests = session_requests(server, sample)
    assert len(requests) == 2
    for request in requests:
        sent = request.body["sampling_params"]
        assert {k: sent[k] for k in GRAMMAR} == GRAMMAR, "the settings win over slime's top_k"
        assert sent["no_stop_trim"] is True and sent["temperature"] == 1.0, "slime's other keys are kept"
        assert "stop_token_ids" in sent and "skip_special_tokens" in sent


async def test_every_key_sglang_accepts_is_passed_on_slimes_path(server):
    """A key slime (or a custom rollout on a newer SGLang) passes is sent, never dropped."""
    sample = new_sample()
    params = {**SLIME_PARAMS, "structural_tag": '{"type": "structural_tag"}', "stream_interval": 4}
    out = await run(server, make_args(server), sample, ANSWER, params=params)
    assert out.status == Sample.Status.COMPLETED
    (request,) = session_requests(server, sample)
    sent = request.body["sampling_params"]
    assert sent["structural_tag"] == '{"type": "structural_tag"}' and sent["stream_interval"] == 4


async def test_a_key_sglang_does_not_accept_stops_the_run(server):
    """It would be refused on every request: a configuration error at the first sample, naming the key."""
    with pytest.raises(ConfigurationError, match="'max_tokens' is not a sampling param SGLang"):
        await rollout.generate(make_args(server), new_sample(), {**SLIME_PARAMS, "max_tokens": 64})
    assert not server.generate_requests


async def test_in_training_the_settings_cannot_change_slimes_temperature(server):
    args = make_args(server, strands={"sampling_params": {"temperature": 0.6}})
    with pytest.raises(ConfigurationError, match=r"set --rollout-temperature 0\.6 instead"):
        await rollout.generate(args, new_sample(), dict(SLIME_PARAMS))
    assert not server.generate_requests
    sample = new_sample()
    out = await run(server, args, sample, ANSWER, evaluation=True)
    assert out.status == Sample.Status.COMPLETED, "eval samples are not trained on: free to sample otherwise"
    (request,) = session_requests(server, sample)
    assert request.body["sampling_params"]["temperature"] == 0.6
