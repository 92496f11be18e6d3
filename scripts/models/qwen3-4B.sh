# shellcheck shell=bash
# Megatron model arguments of Qwen3-4B: the same flags as slime's scripts/models/qwen3-4B.sh
# (4B ties its input and output embeddings, so no --untie-embeddings-and-output-weights).
# Qwen3-4B uses rope_theta 1e6; Qwen3-4B-Instruct-2507 uses 5e6 (the scripts read it from the
# checkpoint's config.json, or set MODEL_ARGS_ROTARY_BASE).
# Used only when slime's own file is not available (see scripts/lib/common.sh, ss_load_model_args).
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file
MODEL_ARGS=(
    --swiglu
    --num-layers 36
    --hidden-size 2560
    --ffn-hidden-size 9728
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --use-rotary-position-embeddings
    --disable-bias-linear
    --normalization RMSNorm
    --norm-epsilon 1e-6
    --rotary-base "${MODEL_ARGS_ROTARY_BASE:-1000000}"
    --vocab-size 151936
    --kv-channels 128
    --qk-layernorm
)
