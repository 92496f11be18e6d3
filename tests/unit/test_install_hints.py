"""The pip command for an optional extra matches how slime-strands was installed: imported from a source
checkout (the README's ``pip install -e .``) or from an installed copy. Real folders, no mocks."""

from __future__ import annotations

from pathlib import Path

import slime_strands
from data_prep.install_hints import install_command

REPO = Path(__file__).resolve().parents[2]


def _package(root: Path, pyproject: str | None) -> Path:
    package = root / "slime_strands"
    package.mkdir(parents=True)
    if pyproject is not None:
        (root / "pyproject.toml").write_text(pyproject)
    return package


def test_a_checkout_gets_the_editable_command(tmp_path):
    package = _package(tmp_path / "slime strands", '[project]\nname = "slime-strands"\nversion = "0.1.0"\n')
    assert install_command("wandb", package) == f"pip install -e '{tmp_path / 'slime strands'}[wandb]'"


def test_an_installed_copy_gets_the_package_command(tmp_path):
    site = _package(tmp_path / "lib" / "site-packages", None)  # no pyproject.toml beside an installed package
    assert install_command("data", site) == "pip install 'slime-strands[data]'"
    other = _package(tmp_path / "other", '[project]\nname = "another-project"\n')
    assert install_command("data", other) == "pip install 'slime-strands[data]'"


def test_this_install():
    """The tests run from the clone the README installs with -e: the command names this clone."""
    assert Path(slime_strands.__file__).resolve().parent == REPO / "slime_strands"
    assert install_command("wandb") == f"pip install -e '{REPO}[wandb]'"
