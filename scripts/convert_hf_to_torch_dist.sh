#!/usr/bin/env bash
# Convert the HF checkpoint (HF_CHECKPOINT) into the Megatron torch_dist checkpoint slime trains from
# (TORCH_DIST_DIR, default ${HF_CHECKPOINT}_torch_dist) with slime's tools/convert_hf_to_torch_dist.py.
# Needs slime, Megatron-LM and a GPU (CONVERT_NPROC>1 runs it on that many GPUs with torchrun).
# Skipped when TORCH_DIST_DIR/latest_checkpointed_iteration.txt exists (FORCE=1 converts again).
#
#   MODEL_NAME=Qwen3-8B bash scripts/convert_hf_to_torch_dist.sh
#   DRY_RUN=1 bash scripts/convert_hf_to_torch_dist.sh
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
ss_defaults

if [ -f "${TORCH_DIST_DIR}/latest_checkpointed_iteration.txt" ] && [ "${FORCE}" != 1 ]; then
    ss_log "${TORCH_DIST_DIR} already holds a converted checkpoint (FORCE=1 to convert again)"
    exit 0
fi

tool="${SLIME_DIR}/tools/convert_hf_to_torch_dist.py"
SS_PREFLIGHT_ERRORS=()
ss_check_python
ss_check_slime
[ -f "${tool}" ] || ss_fail "${tool} not found (SLIME_DIR=${SLIME_DIR})"
ss_check_hf_checkpoint
ss_check_gpus "${CONVERT_NPROC}"
ss_preflight_finish conversion

ss_load_model_args
if [ "${CONVERT_NPROC}" -gt 1 ]; then
    launcher=(torchrun --nproc-per-node "${CONVERT_NPROC}")
else
    launcher=("${PYTHON}")
fi
if ! ss_is_dry_run; then
    cd "${SLIME_DIR}" || ss_die "cannot cd to SLIME_DIR=${SLIME_DIR}"
    mkdir -p "$(dirname "${TORCH_DIST_DIR}")"
fi
ss_run env PYTHONPATH="${MEGATRON_DIR}:${SLIME_DIR}" "${launcher[@]}" "${tool}" "${MODEL_ARGS[@]}" \
    --hf-checkpoint "${HF_CHECKPOINT}" --save "${TORCH_DIST_DIR}"
if ! ss_is_dry_run; then
    [ -f "${TORCH_DIST_DIR}/latest_checkpointed_iteration.txt" ] ||
        ss_die "conversion finished but ${TORCH_DIST_DIR}/latest_checkpointed_iteration.txt is missing"
    ss_log "converted ${HF_CHECKPOINT} -> ${TORCH_DIST_DIR}"
fi
