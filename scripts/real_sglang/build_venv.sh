#!/usr/bin/env bash
# Builds the REAL SGLang server's own virtualenv for the tests/real_sglang tier and prints its python:
#
#     bash scripts/real_sglang/build_venv.sh ~/.cache/slime-strands/sglang-venv
#     SLIME_STRANDS_SGLANG_PYTHON=~/.cache/slime-strands/sglang-venv/bin/python pytest -q tests/real_sglang
#
# Python 3.11 (the torch wheels pinned in requirements.txt are cp311; PYTHON=/path/to/python3.11 picks one),
# every package pinned in requirements.txt and installed with --no-deps (the file is the whole environment).
# pip's own cache makes a rebuild fast (about 6 GB of wheels: torch's CUDA build and its nvidia libraries);
# nothing is cached by hand. A venv already built from the same requirements.txt is kept as it is (a stamp
# file holds the file's hash); a different one is rebuilt from scratch. The last step imports
# sglang.launch_server with the tier's import stub, as the tier's server does.
set -euo pipefail

venv=${1:?usage: build_venv.sh VENV_DIR}
here=$(cd "$(dirname "$0")" && pwd)
requirements="$here/requirements.txt"
python=${PYTHON:-}
if [ -z "$python" ]; then
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            python=$(command -v "$candidate")
            break
        fi
    done
fi
if [ -z "$python" ] || ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "build_venv.sh: needs Python 3.11 (the pinned torch wheels are cp311): set PYTHON=/path/to/python3.11" >&2
    exit 1
fi

stamp="$venv/.slime-strands-requirements.sha256"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    echo "build_venv.sh: $venv is up to date with $requirements" >&2
else
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --no-deps --disable-pip-version-check -r "$requirements"
    echo "$want" >"$stamp"
fi
PYTHONPATH="$here/import_stub" "$venv/bin/python" -c 'import sglang.launch_server' ||
    { echo "build_venv.sh: sglang.launch_server does not import in $venv" >&2; exit 1; }
echo "$venv/bin/python"
