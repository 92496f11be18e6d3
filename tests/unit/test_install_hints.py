"""The pip command for an optional extra matches how slime-strands was installed (PEP 610 direct_url.json):
real distribution metadata folders, no mocks."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from slime_strands.install_hints import install_command


def distribution(tmp_path, direct_url: dict | None) -> importlib.metadata.Distribution:
    info = tmp_path / "slime_strands-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: slime-strands\nVersion: 0.1.0\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return importlib.metadata.PathDistribution(info)


def test_an_editable_install_gets_the_editable_command(tmp_path):
    dist = distribution(tmp_path, {"dir_info": {"editable": True}, "url": "file:///home/me/slime%20strands"})
    assert install_command("wandb", dist) == "pip install -e '/home/me/slime strands[wandb]'"


@pytest.mark.parametrize(
    "direct_url",
    [
        None,  # from an index: pip writes no direct_url.json
        {"dir_info": {}, "url": "file:///home/me/slime-strands"},  # a non-editable install from a folder
        {"archive_info": {}, "url": "https://example.org/slime_strands-0.1.0-py3-none-any.whl"},
    ],
)
def test_other_installs_get_the_package_command(tmp_path, direct_url):
    assert install_command("data", distribution(tmp_path, direct_url)) == "pip install 'slime-strands[data]'"


def test_this_install():
    """The command the test environment itself would get (the README installs a clone with -e)."""
    origin = json.loads(importlib.metadata.distribution("slime-strands").read_text("direct_url.json") or "{}")
    if (origin.get("dir_info") or {}).get("editable"):
        assert install_command("wandb").startswith("pip install -e '/") and install_command("wandb").endswith(
            "[wandb]'"
        )
    else:
        assert install_command("wandb") == "pip install 'slime-strands[wandb]'"
