#!/usr/bin/env bash
# Download the Hugging Face checkpoint HF_REPO (default Qwen/${MODEL_NAME}) into HF_CHECKPOINT
# (default /root/models/${HF_REPO}). Skipped when HF_CHECKPOINT/config.json exists (FORCE=1 re-downloads).
# Uses `hf download`, else `huggingface-cli download`; HF_TOKEN / HF_ENDPOINT are honoured as usual.
#
#   MODEL_NAME=Qwen3-8B bash scripts/download_model.sh
#   DRY_RUN=1 bash scripts/download_model.sh
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
ss_defaults

if [ -f "${HF_CHECKPOINT}/config.json" ] && [ "${FORCE}" != 1 ]; then
    ss_log "${HF_CHECKPOINT} already has config.json: nothing to download (FORCE=1 to re-download)"
    exit 0
fi

SS_PREFLIGHT_ERRORS=()
downloader=()
if command -v hf >/dev/null 2>&1; then
    downloader=(hf download)
elif command -v huggingface-cli >/dev/null 2>&1; then
    downloader=(huggingface-cli download)
else
    ss_fail "neither 'hf' nor 'huggingface-cli' is on PATH: pip install -U huggingface_hub"
    downloader=(hf download)
fi
ss_preflight_finish download

ss_is_dry_run || mkdir -p "${HF_CHECKPOINT}"
ss_run "${downloader[@]}" "${HF_REPO}" --local-dir "${HF_CHECKPOINT}"
if ! ss_is_dry_run; then
    [ -f "${HF_CHECKPOINT}/config.json" ] || ss_die "download finished but ${HF_CHECKPOINT}/config.json is missing"
    ss_log "downloaded ${HF_REPO} to ${HF_CHECKPOINT}"
fi
