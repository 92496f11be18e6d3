#!/usr/bin/env bash
# A geometry agent on a vision-language model: Geometry3K (each problem with its figure; the Python tool shows the
# model the figures its code saves), Qwen3.5-4B on 8 GPUs with slime's Megatron Qwen3.5-VL provider, the same
# plugin, reward and GRPO as the math recipe. Data: `python -m data_prep.prepare --dataset geometry3k` (made
# here when missing), images as data URIs read by slime's --multimodal-keys. docs/training.md, "A VLM agent".
#
#   bash scripts/strands_qwen_vl_geo3k.sh
#   DRY_RUN=1 bash scripts/strands_qwen_vl_geo3k.sh
#
# Another Qwen vision-language checkpoint: MODEL_NAME / MODEL_ARGS_NAME (slime must be able to train it; the
# rollout side reads any Qwen-VL checkpoint's image processor and image tokens from HF_CHECKPOINT).
set -euo pipefail

: "${MODEL_NAME:=Qwen3.5-4B}"
: "${MODEL_ARGS_NAME:=qwen3.5-4B-vl}"
: "${DATA_DIR:=/root/data}"
: "${TRAIN_DATA:=${DATA_DIR}/geo3k-train.jsonl}"
: "${EVAL_DATA:=${DATA_DIR}/geo3k-test.jsonl}"
: "${TRAIN_DATASET:=geometry3k}"
: "${EVAL_DATASET:=geometry3k}"
: "${EVAL_SPLIT:=test}"
: "${EVAL_NAME:=geo3k}"
GEO3K_KEYS='{"image": "images"}'  # slime builds each prompt's image items from the rows' "images"
: "${MULTIMODAL_KEYS:=${GEO3K_KEYS}}"
: "${RUN_SUFFIX:=strands_geo3k}"
: "${WANDB_GROUP:=${MODEL_NAME}-strands-geo3k}"
: "${MAX_RESPONSE_LEN:=4096}"
: "${MAX_TOKENS_PER_GPU:=9216}"
: "${ROLLOUT_BATCH_SIZE:=64}"
: "${GLOBAL_BATCH_SIZE:=512}"

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
: "${PLUGIN_CONFIG:=${SS_REPO_DIR}/configs/strands_geo3k.yaml}"
: "${EVAL_CONFIG_TEMPLATE:=${SS_REPO_DIR}/configs/eval_geo3k.yaml}"
ss_train_main "$@"
