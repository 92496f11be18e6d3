# shellcheck shell=bash
# Megatron model arguments of Qwen3.5-4B as a vision-language model: slime's scripts/models/qwen3.5-4B.sh (sourced
# from SLIME_DIR when there, else the same flags here) with the model built by slime's Qwen3.5-VL provider, as
# slime's own scripts/models/qwen3.5-35B-A3B-vl.sh does for the 35B. slime 624b824a trains vision-language
# models with Megatron through that provider only (Qwen2.5-VL / Qwen3-VL trained on its removed FSDP backend).
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file
if [ -f "${SLIME_DIR:-/root/slime}/scripts/models/qwen3.5-4B.sh" ]; then
    # shellcheck source=/dev/null  # slime's own file, found at run time
    source "${SLIME_DIR:-/root/slime}/scripts/models/qwen3.5-4B.sh"
else
    MODEL_ARGS=(
        --spec "slime_plugins.models.qwen3_5" "get_qwen3_5_spec"
        --disable-bias-linear
        --qk-layernorm
        --group-query-attention
        --num-attention-heads 16
        --num-query-groups 4
        --kv-channels 256
        --num-layers 32
        --hidden-size 2560
        --ffn-hidden-size 9216
        --use-gated-attention
        --normalization RMSNorm
        --apply-layernorm-1p
        --position-embedding-type rope
        --norm-epsilon 1e-6
        --rotary-percent 0.25
        --swiglu
        --vocab-size 248320
        --rotary-base 10000000
        --attention-output-gate
    )
fi
MODEL_ARGS[1]="slime_plugins.models.qwen3_5_vl"
MODEL_ARGS[2]="get_qwen3_5_vl_model_provider"
