# shellcheck shell=bash
# Megatron model arguments of the tiny random-weight Qwen3 that the CPU smoke (scripts/slime_cpu_smoke.sh) serves
# with the real SGLang server: the shape of tests/real_sglang/tiny_model.py's config (2 layers, hidden 64, tied
# embeddings). slime's argument parser checks these flags against the checkpoint even though no Megatron model is
# built under --debug-rollout-only; tests/slime_train/test_smoke_script.py checks they match the config.
# shellcheck disable=SC2034  # MODEL_ARGS is read by the script that sources this file
MODEL_ARGS=(
    --swiglu
    --num-layers 2
    --hidden-size 64
    --ffn-hidden-size 128
    --num-attention-heads 4
    --group-query-attention
    --num-query-groups 2
    --use-rotary-position-embeddings
    --disable-bias-linear
    --normalization RMSNorm
    --norm-epsilon 1e-6
    --rotary-base "${MODEL_ARGS_ROTARY_BASE:-1000000}"
    --vocab-size 151936
    --kv-channels 16
    --qk-layernorm
)
