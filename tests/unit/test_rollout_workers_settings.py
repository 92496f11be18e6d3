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


def test_the_smokes_workers_overlay_is_the_smokes_settings_plus_two_workers():
    smoke = yaml.safe_load((ROOT / "scripts/slime_cpu/smoke_settings.yaml").read_text())
    workers = yaml.safe_load((ROOT / "scripts/slime_cpu/smoke_workers.yaml").read_text())
    section = workers["strands"].pop("rollout_workers")
    assert workers == smoke
    assert PluginSettings.from_mapping({"rollout_workers": section}).rollout_workers.count == 2
