#!/usr/bin/env bash
# Builds the DRIVER virtualenv of the CPU smoke (scripts/slime_cpu_smoke.sh): the Python that runs slime's own
# train.py, its Ray head and workers, and the plugin inside them. Prints its python:
#
#     bash scripts/slime_cpu/build_driver_venv.sh VENV_DIR SGLANG_VENV_PYTHON
#
# Python 3.11 (the server venv's torch is cp311 and is reused: see below). Every package is pinned in
# driver-requirements.txt (the one place, with the reason for each pin) and installed with --no-deps, then this
# checkout (editable, --no-deps). Megatron-LM comes from the snapshot slime pins (../shared/megatron-lm, or
# MEGATRON_TARBALL), extracted into the venv; slime is the unmodified snapshot (../shared/slime, or SLIME_SOURCE).
# After pip, three .pth files (paths of this checkout: a venv is never shared between checkouts):
#   * slime's source, the extracted Megatron and the harness's import stubs of what the Megatron snapshot lacks
#     (tests/slime_train/harness/megatron_stub), importable in every process, the Ray workers included;
#   * the test harness's cpu accelerator (tests/slime_train/harness), imported at start in every process and
#     active only under SLIME_STRANDS_CPU_ACCELERATOR=1 (slime_cpu_accelerator.py says why);
#   * the server venv's site-packages LAST, after the venv's own: torch (~4 GB with its CUDA libraries) is
#     taken from there instead of being installed twice; every package the driver installs itself wins.
# A venv already built from the same inputs (requirements, snapshot, paths) is kept as it is (a stamp file holds
# their hash); otherwise it is rebuilt from scratch. The last step imports what train.py imports, with the cpu
# accelerator on.
set -euo pipefail

venv=${1:?usage: build_driver_venv.sh VENV_DIR SGLANG_VENV_PYTHON}
sglang_python=${2:?usage: build_driver_venv.sh VENV_DIR SGLANG_VENV_PYTHON}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
requirements="$here/driver-requirements.txt"
slime=$(cd "${SLIME_SOURCE:-$repo/../shared/slime}" 2>/dev/null && pwd) ||
    { echo "build_driver_venv.sh: no slime source at ${SLIME_SOURCE:-$repo/../shared/slime} (set SLIME_SOURCE)" >&2; exit 1; }
megatron_tarball=${MEGATRON_TARBALL:-$repo/../shared/megatron-lm/megatron-1dcf0daf.tar.gz}
[ -f "$slime/train.py" ] || { echo "build_driver_venv.sh: $slime has no train.py: not a slime checkout" >&2; exit 1; }
[ -f "$megatron_tarball" ] ||
    { echo "build_driver_venv.sh: no Megatron-LM snapshot at $megatron_tarball (set MEGATRON_TARBALL)" >&2; exit 1; }
server_site=$("$sglang_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') ||
    { echo "build_driver_venv.sh: $sglang_python is not the server venv's python (scripts/real_sglang/build_venv.sh)" >&2; exit 1; }
harness="$repo/tests/slime_train/harness"

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
    echo "build_driver_venv.sh: needs Python 3.11 (it reuses the server venv's cp311 torch): set PYTHON=/path/to/python3.11" >&2
    exit 1
fi

stamp="$venv/.slime-strands-driver.sha256"
want=$({ cat "$requirements" "$megatron_tarball"; echo "$repo $slime $server_site"; } | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    echo "build_driver_venv.sh: $venv is up to date" >&2
else
    rm -rf "$venv"
    "$python" -m venv "$venv"
    pip=("$venv/bin/python" -m pip install --quiet --no-deps --disable-pip-version-check)
    { "${pip[@]}" -r "$requirements" && "${pip[@]}" -e "$repo"; } >"$venv/pip.log" 2>&1 ||
        { tail -n 30 "$venv/pip.log" >&2; echo "build_driver_venv.sh: pip failed (log: $venv/pip.log)" >&2; exit 1; }
    mkdir "$venv/megatron-lm"
    tar -xzf "$megatron_tarball" -C "$venv/megatron-lm"
    # After pip: pip sees only what it installed itself, never the server venv's packages.
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$slime" "$venv/megatron-lm" "$harness/megatron_stub" >"$site/slime-strands-slime-source.pth"
    printf '%s\n' "$harness" 'import slime_cpu_accelerator; slime_cpu_accelerator.install()' \
        >"$site/slime-strands-cpu-accelerator.pth"
    echo "$server_site" >"$site/zz-slime-strands-server-torch.pth" # last: the venv's own packages win
    echo "$want" >"$stamp"
fi
(cd "$slime" && SLIME_STRANDS_CPU_ACCELERATOR=1 "$venv/bin/python" -c '
import megatron.training, ray, sglang.srt.server_args, slime.utils.arguments, slime.ray.placement_group
from slime.utils import accelerator
assert accelerator.get_accelerator().name == "cpu", accelerator.get_accelerator()
import slime_strands.rollout, slime_strands.metrics, slime_strands.reward_norm
') >"$venv/import-check.log" 2>&1 || {
    tail -n 30 "$venv/import-check.log" >&2
    echo "build_driver_venv.sh: what train.py imports does not import in $venv (log: $venv/import-check.log)" >&2
    exit 1
}
echo "$venv/bin/python"
