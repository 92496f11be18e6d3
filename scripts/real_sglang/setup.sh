#!/usr/bin/env bash
# Sets up the tests/real_sglang tier under DIR and prints the variables that enable it:
#
#     eval "$(bash scripts/real_sglang/setup.sh ~/.cache/slime-strands)"
#     pytest -q tests/real_sglang
#
# DIR/sglang-venv: the REAL SGLang server's own venv (build_venv.sh, Python 3.11, requirements.txt).
# DIR/slime-deps:  what slime's rollout module imports beyond the project's test dependencies
#                  (slime-requirements.txt, installed with the project's python: PROJECT_PYTHON, default python3).
# slime's source is the unmodified snapshot beside the repository (../shared/slime), or SLIME_SOURCE.
# Both steps are kept when already done for the same requirements (pip's cache makes a rebuild fast).
set -euo pipefail

dir=${1:?usage: setup.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

sglang_python=$(bash "$here/build_venv.sh" "$dir/sglang-venv" | tail -n 1)

deps="$dir/slime-deps"
stamp="$deps/.slime-strands-requirements.sha256"
want=$(sha256sum "$here/slime-requirements.txt" | cut -d' ' -f1)
if ! { [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; }; then
    rm -rf "$deps"
    "${PROJECT_PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check --target "$deps" \
        -r "$here/slime-requirements.txt" >&2
    echo "$want" >"$stamp"
fi

slime=${SLIME_SOURCE:-$repo/../shared/slime}
if [ ! -f "$slime/slime/rollout/sglang_rollout.py" ]; then
    echo "setup.sh: no slime source at $slime (set SLIME_SOURCE to a checkout of THUDM/slime)" >&2
    exit 1
fi
slime=$(cd "$slime" && pwd)

echo "export SLIME_STRANDS_SGLANG_PYTHON=$sglang_python"
echo "export SLIME_STRANDS_SLIME_SOURCE=$slime"
echo "export SLIME_STRANDS_SLIME_DEPS=$deps"
