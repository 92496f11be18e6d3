# shellcheck shell=bash
# Megatron model arguments of Qwen3-8B: the same flags as slime's scripts/models/qwen3-8B.sh.
# Used only when slime's own file is not available (MODEL_ARGS_SOURCE=auto falls back to it,
# MODEL_ARGS_SOURCE=bundled forces it): it lets DRY_RUN and the tests work without slime.
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file
MODEL_ARGS=(
    --swiglu
    --num-layers 36
    --hidden-size 4096
    --ffn-hidden-size 12288
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
    --untie-embeddings-and-output-weights
)
