#!/usr/bin/env bash
# Agentic RL recipe: Qwen3-8B + GRPO on dapo-math-17k with a Strands math agent (Python tool),
# evaluated on AIME-2024 (accuracy + pass@k), inside the slimerl/slime image on one 8-GPU node.
#
#   bash scripts/strands_qwen3_8b.sh                 # prepares what is missing, then trains
#   DRY_RUN=1 bash scripts/strands_qwen3_8b.sh       # prints the commands, runs nothing
#
# Every setting is an environment variable (see scripts/lib/common.sh, ss_defaults, and the
# training guide, docs/training.md); the values below are this recipe's defaults.
set -euo pipefail

: "${MODEL_NAME:=Qwen3-8B}"
: "${MODEL_ARGS_NAME:=qwen3-8B}"
: "${NUM_GPUS:=8}"
: "${TP_SIZE:=2}"
: "${MAX_RESPONSE_LEN:=16384}"
: "${MAX_TOKENS_PER_GPU:=18432}"
: "${ROLLOUT_BATCH_SIZE:=16}"
: "${GLOBAL_BATCH_SIZE:=128}"
: "${SGLANG_MEM_FRACTION:=0.4}"

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
ss_train_main "$@"
