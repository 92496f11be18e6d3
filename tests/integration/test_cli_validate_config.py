"""``slime-strands validate-config`` as a user's shell runs it (a real process): a misspelt section, tools that
do not import and out-of-range sampling values are reported; a good file gets a short summary."""

from __future__ import annotations

import pytest
from cli_helpers import run_cli_process

pytestmark = pytest.mark.timeout(120)


def test_a_misspelt_section_is_not_ok(tmp_path):
    path = tmp_path / "plugin.yaml"
    path.write_text("strand:\n  max_tool_iters: 3\n")
    code, stdout, _ = run_cli_process("validate-config", str(path))
    assert code == 1
    assert (
        stdout.strip() == f"{path}: invalid: {path}: unknown top-level key 'strand': did you mean 'strands'?"
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("Strands:\n  max_tool_iters: 3\n", "unknown top-level key 'Strands': did you mean 'strands'?"),
        (
            "strands: {}\nmax_tool_iters: 3\n",
            "'max_tool_iters': it is a plugin setting: indent it under strands:",
        ),
        (
            "strands: {}\nrollout_batch_size: 8\n",
            "'rollout_batch_size': the plugin's settings file holds only",
        ),
        ("eval:\n  datasets: []\n", "'eval': this is slime's --eval-config (the datasets slime evaluates"),
        (
            "strands:\n  max_tool_iter: 3\n",
            "unknown setting(s) max_tool_iter (did you mean 'max_tool_iters'?)",
        ),
    ],
)
def test_other_top_level_keys_are_named(tmp_path, text, says):
    path = tmp_path / "plugin.yaml"
    path.write_text(text)
    code, stdout, _ = run_cli_process("validate-config", str(path))
    assert code == 1 and says in stdout


def test_a_file_shared_with_slimes_args(tmp_path):
    """--allow-other-keys: a --custom-config-path file may hold keys for slime; a near-miss of strands not."""
    path = tmp_path / "custom.yaml"
    path.write_text("strands:\n  max_tool_iters: 3\nrollout_batch_size: 8\n")
    code, stdout, _ = run_cli_process("validate-config", str(path), "--allow-other-keys")
    assert code == 0 and stdout.startswith(f"{path}: ok\n")
    path.write_text("strands:\n  max_tool_iters: 3\nstrand:\n  max_tool_iters: 4\n")
    code, stdout, _ = run_cli_process("validate-config", str(path), "--allow-other-keys")
    assert code == 1 and "unknown top-level key 'strand': did you mean 'strands'?" in stdout


def test_the_tools_are_imported(tmp_path):
    path = tmp_path / "plugin.yaml"
    path.write_text("strands:\n  tools: [rollout_tools.add, rollout_tools.nope]\n")
    code, stdout, _ = run_cli_process("validate-config", str(path))
    assert code == 1
    assert stdout.strip() == f"{path}: invalid: tools: module 'rollout_tools' has no attribute 'nope'"
    path.write_text("strands:\n  tools: [no_such_package_xyz.tool]\n")
    code, stdout, _ = run_cli_process("validate-config", str(path))
    assert code == 1 and "tools: 'no_such_package_xyz.tool' cannot be imported: ModuleNotFoundError" in stdout


def test_an_out_of_range_sampling_value_is_not_ok(tmp_path):
    path = tmp_path / "plugin.yaml"
    path.write_text("strands:\n  sampling_params: {top_p: 0}\n")
    code, stdout, _ = run_cli_process("validate-config", str(path))
    assert code == 1 and "strands.sampling_params.top_p: must be a number in (0, 1], got 0" in stdout


def test_a_good_file_gets_a_short_summary(tmp_path):
    path = tmp_path / "plugin.yaml"
    prompt = "Solve it. " * 20
    path.write_text(
        "strands:\n"
        "  tools: [rollout_tools.add, rollout_tools.echo]\n"
        f"  system_prompt: {prompt.strip()!r}\n"
        "  max_tool_iters: 3\n"
        "  sandbox: {timeout_s: 5}\n"
        "  sampling_params: {top_k: 20}\n"
    )
    code, stdout, stderr = run_cli_process("validate-config", str(path))
    assert code == 0, stderr
    assert stdout.splitlines() == [
        f"{path}: ok",
        "  tools: add (rollout_tools.add), echo (rollout_tools.echo)",
        "  tool parser: auto; thinking: the template's default; context management: none",
        f"  changed from the defaults: system_prompt ({len(prompt.strip())} characters), max_tool_iters 3, "
        'sandbox.timeout_s 5.0, sampling_params {"top_k": 20}',
    ]
