#!/usr/bin/env bash
# Prepare the recipe's data in slime's format: dapo-math-17k (training) -> TRAIN_DATA and
# AIME-2024 (eval) -> EVAL_DATA (defaults under DATA_DIR=/root/data). Existing files are kept
# (FORCE=1 rebuilds them). Needs `datasets` (pip install -e '.[data]') and hub access.
#
#   bash scripts/prepare_data.sh
#   DATA_DIR=/mnt/data DRY_RUN=1 bash scripts/prepare_data.sh
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
ss_defaults

for pair in "dapo-math-17k=${TRAIN_DATA}" "aime-2024=${EVAL_DATA}"; do
    name="${pair%%=*}"
    out="${pair#*=}"
    if [ -s "${out}" ] && [ "${FORCE}" != 1 ]; then
        ss_log "${out} exists: keeping it (FORCE=1 rebuilds it)"
        continue
    fi
    ss_prepare_dataset "${name}" "${out}"
done
