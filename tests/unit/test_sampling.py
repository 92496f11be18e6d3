"""slime_strands.provider.sampling: the sampling keys SGLang accepts (0.5.15 to 0.5.23), the settings' frozen params and
how an episode's params are merged."""

from __future__ import annotations

import pytest

from slime_strands import SGLangModel
from slime_strands.errors import ConfigurationError
from slime_strands.provider.sampling import (
    SGLANG_SAMPLING_KEYS,
    SamplingParamError,
    SamplingParams,
    check_sampling_keys,
    merge_sampling_params,
)
from slime_strands.settings import PluginSettings, SettingsError

# The fields SGLang 0.5.23's /generate names in its "unknown field" 400 (sglang-0.5.23-answers/
# error_unknown_sampling_param.json), less `choice`, which its SamplingParams does not have.
SGLANG_0_5_23_FIELDS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark",
}  # fmt: skip
# Every key slime (THUDM/slime, slime/rollout/sglang_rollout.py: GenerateState, eval, generate_and_rm's
# deterministic seeds) puts in the sampling_params it hands to a custom generate function.
SLIME_KEYS = {
    "temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "skip_special_tokens",
    "no_stop_trim", "spaces_between_special_tokens", "custom_params", "sampling_seed", "repetition_penalty",
    "min_new_tokens",
}  # fmt: skip


def test_the_keys_are_sglangs_own():
    assert SGLANG_SAMPLING_KEYS == SGLANG_0_5_23_FIELDS
    assert {"structural_tag", "beam_width", "stream_interval", "watermark"} <= SGLANG_SAMPLING_KEYS
    assert not {"stop_strs", "is_normalized", "choice", "max_tokens"} & SGLANG_SAMPLING_KEYS


def test_slimes_keys_are_never_refused():
    check_sampling_keys(dict.fromkeys(SLIME_KEYS, 1), "slime's sampling params")
    params = merge_sampling_params(dict.fromkeys(SLIME_KEYS, 1) | {"stop": None}, {}, training=True)
    assert set(params) == SLIME_KEYS - {"stop"}, "None is SGLang's default: left out, nothing else"


def test_the_model_takes_every_key_sglang_takes(tokenizer):
    params = {
        "structural_tag": '{"type": "structural_tag"}',
        "beam_width": 2,
        "watermark": {"enabled": False},
    }
    model = SGLangModel(tokenizer=tokenizer, base_url="http://127.0.0.1:9", sampling_params=params)
    assert model.config["params"] == params
    with pytest.raises(SamplingParamError, match="'max_tokens' is not a sampling param SGLang"):
        SGLangModel(tokenizer=tokenizer, base_url="http://127.0.0.1:9", params={"max_tokens": 4})


def test_an_unknown_key_from_the_caller_is_refused_not_dropped():
    with pytest.raises(ConfigurationError, match="'best_of' is not a sampling param"):
        merge_sampling_params({"max_new_tokens": 8, "best_of": 2}, {}, training=True)


def test_the_settings_win_and_max_new_tokens_caps_each_turn():
    settings = SamplingParams({"top_k": 20, "stop": ["</answer>"], "max_new_tokens": 512, "temperature": 0.6})
    given = {"top_k": -1, "max_new_tokens": 4096, "temperature": 0.6, "stop": None}
    merged = merge_sampling_params(given, settings, training=True)
    assert merged == {"top_k": 20, "stop": ["</answer>"], "max_new_tokens": 512, "temperature": 0.6}
    assert merge_sampling_params({"max_new_tokens": 100}, settings, training=True)["max_new_tokens"] == 100
    assert merge_sampling_params({}, settings, training=False)["max_new_tokens"] == 512


@pytest.mark.parametrize(
    ("key", "flag"), [("temperature", "--rollout-temperature"), ("top_p", "--rollout-top-p")]
)
def test_in_training_slimes_trainer_owns_temperature_and_top_p(key, flag):
    settings = SamplingParams({key: 0.5})
    with pytest.raises(SamplingParamError, match=f"set {flag} 0.5 instead"):
        merge_sampling_params({key: 1.0}, settings, training=True)
    assert merge_sampling_params({key: 1.0}, settings, training=False)[key] == 0.5, "eval samples freely"
    assert merge_sampling_params({key: 0.5}, settings, training=True)[key] == 0.5


def test_sampling_params_are_frozen_hashable_json():
    params = SamplingParams({"stop": ["x"], "logit_bias": {"1": -5.0}, "regex": None})
    assert dict(params) == {"stop": ["x"], "logit_bias": {"1": -5.0}}, "None means SGLang's default"
    assert params == {"stop": ["x"], "logit_bias": {"1": -5.0}} and hash(params) == hash(
        SamplingParams(params)
    )
    params["stop"].append("y")
    assert params["stop"] == ["x"], "a value read out cannot change the settings"
    assert params.with_overrides({"stop": ["z"]}, where="flags") == {"stop": ["z"], "logit_bias": {"1": -5.0}}
    with pytest.raises(SamplingParamError, match=r"sampling_params\.stop: .* is not a JSON value"):
        SamplingParams({"stop": {1, 2}})
    with pytest.raises(SamplingParamError, match="max_new_tokens: must be a positive integer"):
        SamplingParams({"max_new_tokens": 1.5})
    with pytest.raises(SamplingParamError, match="temperature: must be a number"):
        SamplingParams({"temperature": "hot"})


def test_settings_take_sampling_params_and_name_a_bad_key():
    settings = PluginSettings.from_mapping(
        {
            "sampling_params": {
                "regex": "Answer: .*",
                "top_k": 20,
                "stop": ["</answer>"],
                "logit_bias": {"7": 1},
            }
        }
    )
    assert settings.sampling_params == {
        "regex": "Answer: .*",
        "top_k": 20,
        "stop": ["</answer>"],
        "logit_bias": {"7": 1},
    }
    assert hash(settings) == hash(
        PluginSettings.from_mapping({"sampling_params": dict(settings.sampling_params)})
    )
    with pytest.raises(SettingsError, match=r"^sampling_params: 'max_tokens' is not a sampling param SGLang"):
        PluginSettings.from_mapping({"sampling_params": {"top_k": 20, "max_tokens": 5}})
    with pytest.raises(SettingsError, match="sampling_params: expected a mapping"):
        PluginSettings.from_mapping({"sampling_params": ["top_k"]})
    assert PluginSettings.from_mapping({"sampling_params": None}).sampling_params == {}


def test_two_grammars_at_one_level_are_refused_in_one_line(tokenizer):
    """SGLang refuses every request with two grammars (400 "Only one of json_schema, regex, ebnf, or
    structural_tag can be set."): a configuration that sets two stops the run instead of failing each sample."""
    with pytest.raises(SamplingParamError, match="regex and structural_tag are both set"):
        SamplingParams({"regex": "a+", "structural_tag": "{}"})
    with pytest.raises(SamplingParamError, match="json_schema and ebnf"):
        merge_sampling_params({"json_schema": "{}", "ebnf": "root ::= 'a'"}, {}, training=False)
    with pytest.raises(SamplingParamError, match="regex and ebnf"):
        SGLangModel(
            tokenizer=tokenizer, base_url="http://127.0.0.1:9", sampling_params={"regex": "a", "ebnf": "b"}
        )


def test_a_higher_levels_grammar_replaces_the_lower_ones():
    settings = SamplingParams({"regex": "a+", "top_k": 5})
    flags = settings.with_overrides({"ebnf": "root ::= 'b'"}, where="--sampling-param")
    assert dict(flags) == {"ebnf": "root ::= 'b'", "top_k": 5}
    merged = merge_sampling_params({"regex": "c+", "temperature": 1.0}, settings, training=True)
    assert merged == {"regex": "a+", "top_k": 5, "temperature": 1.0}
    merged = merge_sampling_params({"json_schema": "{}"}, SamplingParams({"top_k": 5}), training=False)
    assert merged == {"json_schema": "{}", "top_k": 5}, "no grammar above: the caller's stays"


def test_a_value_sglang_refuses_stops_the_run_at_the_first_sample(tokenizer):
    """The model's params and an episode's merged params (slime's, the settings', eval's): a value out of
    SGLang's range would fail every request of every episode, so it is a configuration error at once."""
    with pytest.raises(SamplingParamError, match=r"top_p must be a number in \(0, 1\]"):
        SGLangModel(tokenizer=tokenizer, base_url="http://127.0.0.1:9", sampling_params={"top_p": 1.5})
    with pytest.raises(SamplingParamError, match="top_k must be -1 or an integer >= 1"):
        merge_sampling_params({"top_k": 0}, {}, training=True)
    settings = PluginSettings.from_mapping({"sampling_params": {"temperature": -1}}).sampling_params
    with pytest.raises(SamplingParamError, match="temperature must be a number >= 0"):
        merge_sampling_params({"temperature": 1.0}, settings, training=False)
    assert merge_sampling_params({"top_k": -1, "temperature": 0}, {}, training=False) == {
        "top_k": -1,
        "temperature": 0,
    }
