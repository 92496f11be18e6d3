#!/usr/bin/env bash
# Smaller variant of scripts/strands_qwen3_8b.sh: Qwen3-4B on 4 GPUs (same agent, data, reward and
# eval; shorter training responses and smaller micro-batches).
#
#   bash scripts/strands_qwen3_4b.sh
#   DRY_RUN=1 bash scripts/strands_qwen3_4b.sh
#
# For Qwen3-4B-Instruct-2507: MODEL_NAME=Qwen3-4B-Instruct-2507 (its rope_theta is read from the
# checkpoint's config.json).
set -euo pipefail

: "${MODEL_NAME:=Qwen3-4B}"
: "${MODEL_ARGS_NAME:=qwen3-4B}"
: "${NUM_GPUS:=4}"
: "${TP_SIZE:=2}"
: "${MAX_RESPONSE_LEN:=8192}"
: "${MAX_TOKENS_PER_GPU:=9216}"
: "${ROLLOUT_BATCH_SIZE:=16}"
: "${GLOBAL_BATCH_SIZE:=128}"
: "${SGLANG_MEM_FRACTION:=0.5}"

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
ss_train_main "$@"
