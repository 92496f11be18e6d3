#!/usr/bin/env bash
# Convert a trained Megatron torch_dist checkpoint back to Hugging Face format (to evaluate, serve or
# publish it) with slime's tools/convert_torch_dist_to_hf.py. Runs on CPU.
#
#   CKPT_DIR   the run's --save directory (default SAVE_DIR, i.e. ${HF_CHECKPOINT}_strands_dapo)
#   ITERATION  which checkpoint: a number (e.g. 200 -> iter_0000200), "release", or empty for the
#              latest one, read from CKPT_DIR/latest_checkpointed_iteration.txt (Megatron's tracker)
#   HF_OUT     output directory (default ${CKPT_DIR}_hf/iter_XXXXXXX); FORCE=1 overwrites it
#   HF_CHECKPOINT  the original HF checkpoint: tokenizer, config and chat template are copied from it
#
#   bash scripts/convert_torch_dist_to_hf.sh
#   ITERATION=100 HF_OUT=/root/models/my-agent bash scripts/convert_torch_dist_to_hf.sh
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
ss_defaults

tool="${SLIME_DIR}/tools/convert_torch_dist_to_hf.py"
SS_PREFLIGHT_ERRORS=()
ss_check_python
ss_check_slime
[ -f "${tool}" ] || ss_fail "${tool} not found (SLIME_DIR=${SLIME_DIR})"
ss_check_hf_checkpoint

iteration="${ITERATION}"
if [ -z "${iteration}" ]; then
    tracker="${CKPT_DIR}/latest_checkpointed_iteration.txt"
    if [ -f "${tracker}" ]; then
        iteration="$(tr -d '[:space:]' <"${tracker}")"
    else
        ss_fail "${tracker} not found: is CKPT_DIR=${CKPT_DIR} a Megatron --save directory? (or set ITERATION)"
        iteration="XXXXXXX"
    fi
fi
case "${iteration}" in
    release) iter_dir="release" ;;
    *[!0-9]*) iter_dir="iter_${iteration}" ;;
    *) iter_dir="$(printf 'iter_%07d' "$((10#${iteration}))")" ;;
esac
input_dir="${CKPT_DIR}/${iter_dir}"
output_dir="${HF_OUT:-${CKPT_DIR}_hf/${iter_dir}}"
[ -d "${input_dir}" ] || ss_fail "checkpoint directory ${input_dir} does not exist"
if [ -e "${output_dir}" ] && [ "${FORCE}" != 1 ]; then
    ss_fail "${output_dir} already exists (FORCE=1 overwrites it, or set HF_OUT)"
fi
ss_preflight_finish conversion

args=(--input-dir "${input_dir}" --output-dir "${output_dir}" --origin-hf-dir "${HF_CHECKPOINT}")
# Megatron pads the vocabulary for tensor parallelism; trim it back to the model's real size.
vocab_size="${VOCAB_SIZE:-}"
if [ -z "${vocab_size}" ] && [ -f "${HF_CHECKPOINT}/config.json" ]; then
    vocab_size="$("${PYTHON}" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("vocab_size", ""))' \
        "${HF_CHECKPOINT}/config.json" 2>/dev/null || true)"
fi
[ -n "${vocab_size}" ] && args+=(--vocab-size "${vocab_size}")
[ "${FORCE}" = 1 ] && args+=(--force)

ss_run env PYTHONPATH="${MEGATRON_DIR}:${SLIME_DIR}" "${PYTHON}" "${tool}" "${args[@]}"
ss_is_dry_run || ss_log "wrote ${output_dir}"
