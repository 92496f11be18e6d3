"""``rollout_workers`` settings: strict like the others, and the smoke's workers overlay is the smoke's settings
plus exactly the workers (the two files cannot drift apart)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slime_strands.settings import PluginSettings, RolloutWorkersSettings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_runs_episodes_in_slimes_process():
    assert PluginSettings().rollout_workers == RolloutWorkersSettings(count=0)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"count": -1}, r"rollout_workers\.count must be >= 0"),
        ({"max_in_flight": 0}, r"rollout_workers\.max_in_flight must be > 0 or null"),
        ({"custom_resource": " "}, r"rollout_workers\.custom_resource must be a resource name"),
        ({"cont": 2}, r"rollout_workers\.cont \(did you mean 'count'\?\)"),
        ({"count": "2"}, r"rollout_workers\.count: expected int"),
    ],
)
def test_bad_rollout_workers_settings_are_one_line_naming_the_key(section, message):
    with pytest.raises(SettingsError, match=message):
        PluginSettings.from_mapping({"rollout_workers": section})


def test_the_smokes_workers_overlay_is_the_smokes_grammar_plus_two_workers_that_hand_aborts_back():
    """The async_workers overlay: the sync smoke's grammar, two rollout workers, the sandbox in each worker
    (not the sync smoke's Ray pool) and no resend of a turn the server aborts."""
    smoke = yaml.safe_load((ROOT / "scripts/slime_cpu/smoke_settings.yaml").read_text())["strands"]
    workers = yaml.safe_load((ROOT / "scripts/slime_cpu/smoke_workers.yaml").read_text())["strands"]
    assert sorted(workers) == ["rollout_workers", "sampling_params", "server_abort_retries"]
    assert workers["sampling_params"] == smoke["sampling_params"]
    settings = PluginSettings.from_mapping(workers)
    assert settings.rollout_workers.count == 2 and settings.server_abort_retries == 0
    assert settings.sandbox == PluginSettings().sandbox, (
        "the sandbox runs in the worker, placed as by default"
    )
