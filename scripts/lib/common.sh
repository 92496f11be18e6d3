# shellcheck shell=bash
# Shared code of the slime-strands launch and checkpoint scripts. Sourced, never executed.
#
# Conventions (every script):
#   * configuration comes from environment variables with defaults (ss_defaults lists them all);
#   * DRY_RUN=1 prints every command (one line each, prefixed with "+ ", shell-quoted so it can be
#     copy-pasted) instead of running it, needs neither GPUs nor slime, and reports preflight
#     failures without aborting;
#   * nothing is killed that this script did not start: no pkill; `ray stop` only for a Ray head
#     this script started itself (and not with KEEP_RAY=1).

# ---------------------------------------------------------------------------------------------
# Logging and command execution
# ---------------------------------------------------------------------------------------------

ss_log() { printf '[slime-strands] %s\n' "$*" >&2; }
ss_warn() { printf '[slime-strands] WARNING: %s\n' "$*" >&2; }
ss_die() {
    printf '[slime-strands] ERROR: %s\n' "$*" >&2
    exit 1
}

ss_is_dry_run() { [ "${DRY_RUN:-0}" = 1 ]; }

# Quote one word for a POSIX shell: as is when it is plain, otherwise in single quotes.
ss_quote() {
    if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
        printf '%s' "$1"
    else
        local sq="'\\''"
        printf "'%s'" "${1//\'/${sq}}"
    fi
}

# Print a command as one shell-quoted line (copy-pastable); the value after --wandb-key is redacted.
ss_print_cmd() {
    local out="+" redact=0 arg
    for arg in "$@"; do
        if [ "$redact" = 1 ]; then
            arg="<redacted>"
            redact=0
        fi
        [ "$arg" = "--wandb-key" ] && redact=1
        out+=" $(ss_quote "$arg")"
    done
    printf '%s\n' "$out"
}

# Run a command, or only print it under DRY_RUN=1. The command is always echoed (stdout).
ss_run() {
    ss_print_cmd "$@"
    if ss_is_dry_run; then
        return 0
    fi
    "$@"
}

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

SS_REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SS_SCRIPTS_DIR="${SS_REPO_DIR}/scripts"

# Every variable the scripts read, with its default. Model scripts set their own defaults first
# (with `: "${VAR:=value}"`), so an environment variable always wins.
ss_defaults() {
    : "${DRY_RUN:=0}"
    : "${AUTO_PREPARE:=1}"
    : "${KEEP_RAY:=0}"
    : "${FORCE:=0}"
    # Software locations inside the slimerl/slime image.
    : "${SLIME_DIR:=/root/slime}"
    : "${MEGATRON_DIR:=/root/Megatron-LM}"
    : "${PYTHON:=python3}"
    # Model and checkpoints.
    : "${MODEL_NAME:=Qwen3-8B}"
    : "${MODEL_ORG:=Qwen}"
    : "${HF_REPO:=${MODEL_ORG}/${MODEL_NAME}}"
    : "${MODELS_DIR:=/root/models}"
    : "${HF_CHECKPOINT:=${MODELS_DIR}/${HF_REPO}}"
    : "${TORCH_DIST_DIR:=${HF_CHECKPOINT}_torch_dist}"
    : "${RUN_SUFFIX:=strands_dapo}"
    : "${SAVE_DIR:=${HF_CHECKPOINT}_${RUN_SUFFIX}}"
    : "${MODEL_ARGS_NAME:=$(ss_model_args_name_for "${MODEL_NAME}")}"
    : "${MODEL_ARGS_SOURCE:=auto}"
    : "${MODEL_ARGS_ROTARY_BASE:=}"
    # Data.
    : "${DATA_DIR:=/root/data}"
    : "${TRAIN_DATA:=${DATA_DIR}/dapo-math-17k.jsonl}"
    : "${EVAL_DATA:=${DATA_DIR}/aime-2024.jsonl}"
    # What AUTO_PREPARE makes TRAIN_DATA / EVAL_DATA from (data_prep datasets and hub splits), the eval
    # config's dataset EVAL_DATA feeds, and slime's --multimodal-keys (a vision-language dataset's images).
    : "${TRAIN_DATASET:=dapo-math-17k}"
    : "${TRAIN_SPLIT:=}"
    : "${EVAL_DATASET:=aime-2024}"
    : "${EVAL_SPLIT:=}"
    : "${EVAL_NAME:=aime}"
    : "${MULTIMODAL_KEYS:=}"
    # Plugin settings and eval config (absolute paths).
    : "${PLUGIN_CONFIG:=${SS_REPO_DIR}/configs/strands_math.yaml}"
    : "${EVAL_CONFIG_TEMPLATE:=${SS_REPO_DIR}/configs/eval_aime.yaml}"
    # The training reward (slime's --custom-rm-path): the environment's (code: slime_strands.reward.code_reward).
    : "${REWARD_PATH:=slime_strands.reward.math_reward}"
    : "${EVAL_N_SAMPLES:=}"
    : "${EVAL_MAX_RESPONSE_LEN:=}"
    # Cluster. NUM_GPUS is per node.
    : "${NUM_GPUS:=8}"
    : "${NUM_NODES:=1}"
    : "${MASTER_ADDR:=}"
    : "${RAY_PORT:=6379}"
    : "${RAY_DASHBOARD_PORT:=8265}"
    : "${WAIT_FOR_WORKERS_S:=900}"
    # Weights & Biases. Without a key the run logs offline (sync later with `wandb sync`).
    : "${WANDB_PROJECT:=slime-strands}"
    : "${WANDB_GROUP:=${MODEL_NAME}-strands-dapo}"
    : "${WANDB_KEY:=${WANDB_API_KEY:-}}"
    : "${WANDB_DIR:=${SAVE_DIR}/wandb}"
    # Recipe knobs (the slime strands example's values for Qwen3-8B on 8 GPUs).
    : "${NUM_ROLLOUT:=3000}"
    : "${ROLLOUT_BATCH_SIZE:=16}"
    : "${N_SAMPLES_PER_PROMPT:=8}"
    : "${GLOBAL_BATCH_SIZE:=128}"
    : "${MAX_RESPONSE_LEN:=16384}"
    : "${MAX_CONTEXT_LEN:=}"
    : "${ROLLOUT_TEMPERATURE:=1}"
    : "${EVAL_INTERVAL:=20}"
    : "${SAVE_INTERVAL:=20}"
    : "${TP_SIZE:=2}"
    : "${MAX_TOKENS_PER_GPU:=18432}"
    : "${LR:=1e-6}"
    : "${ROLLOUT_GPUS_PER_ENGINE:=2}"
    : "${SGLANG_MEM_FRACTION:=0.4}"
    : "${EXTRA_TRAIN_ARGS:=}"
    # Partial rollout: PARTIAL_ROLLOUT=1 over-samples (OVER_SAMPLING_BATCH_SIZE groups in flight, default
    # 1.5x ROLLOUT_BATCH_SIZE), aborts the slowest episodes once the batch is full and continues them at the
    # next step where they stopped; MASK_OFFPOLICY=1 takes what an older policy wrote out of the loss.
    : "${PARTIAL_ROLLOUT:=0}"
    : "${OVER_SAMPLING_BATCH_SIZE:=}"
    : "${MASK_OFFPOLICY:=0}"
    # Checkpoint helpers.
    : "${CONVERT_NPROC:=1}"
    : "${CKPT_DIR:=${SAVE_DIR}}"
    : "${ITERATION:=}"
    : "${HF_OUT:=}"
}

# The slime model-args file (scripts/models/<name>.sh) for a model name.
ss_model_args_name_for() {
    case "$1" in
        Qwen3-8B*) echo "qwen3-8B" ;;
        Qwen3-4B*) echo "qwen3-4B" ;;
        *) echo "" ;;
    esac
}

# ---------------------------------------------------------------------------------------------
# Model arguments (MODEL_ARGS array)
# ---------------------------------------------------------------------------------------------

# Which model-args file ss_load_model_args reads (SS_MODEL_ARGS_FILE), said once per run: a recipe says it
# before it prepares, and the helpers it runs (the conversion) get SS_MODEL_ARGS_NOTED and do not repeat it.
ss_pick_model_args() {
    local name="${MODEL_ARGS_NAME}"
    [ -n "$name" ] || ss_die "no model-args file known for MODEL_NAME=${MODEL_NAME}: set MODEL_ARGS_NAME (e.g. qwen3-8B)"
    local slime_file="${SLIME_DIR}/scripts/models/${name}.sh"
    local bundled_file="${SS_SCRIPTS_DIR}/models/${name}.sh"
    local file why=""
    case "${MODEL_ARGS_SOURCE}" in
        slime)
            [ -f "$slime_file" ] || ss_die "MODEL_ARGS_SOURCE=slime but ${slime_file} does not exist (is SLIME_DIR=${SLIME_DIR} a slime checkout?)"
            file="$slime_file"
            ;;
        bundled)
            file="$bundled_file"
            ;;
        auto)
            if [ -f "$slime_file" ]; then
                file="$slime_file"
            else
                file="$bundled_file"
                why=" (${slime_file} not found: the bundled copy)"
            fi
            ;;
        *) ss_die "MODEL_ARGS_SOURCE must be auto, slime or bundled (got ${MODEL_ARGS_SOURCE})" ;;
    esac
    SS_MODEL_ARGS_FILE="$file"
    if [ "${SS_MODEL_ARGS_NOTED:-}" != "$file" ]; then
        ss_log "model args from ${file}${why}"
        SS_MODEL_ARGS_NOTED="$file"
    fi
}

# Load MODEL_ARGS. MODEL_ARGS_SOURCE=auto (default) sources slime's own
# ${SLIME_DIR}/scripts/models/<name>.sh when it exists (stays in sync with the installed slime) and
# otherwise this repository's copy in scripts/models/ (same flags, so DRY_RUN and the tests work
# without slime); =slime requires slime's file; =bundled always uses ours.
# The rotary base is then set to MODEL_ARGS_ROTARY_BASE, else the checkpoint's config.json
# rope_theta (Qwen3-4B-Instruct-2507 uses 5e6, not the 1e6 of the file).
ss_load_model_args() {
    ss_pick_model_args
    local file="${SS_MODEL_ARGS_FILE}"
    [ -f "$file" ] || ss_die "model args file ${file} does not exist"
    MODEL_ARGS=()
    # shellcheck source=/dev/null  # the file is chosen at run time (slime's or ours)
    source "$file"
    [ "${#MODEL_ARGS[@]}" -gt 0 ] || ss_die "${file} did not define MODEL_ARGS"

    local rotary="${MODEL_ARGS_ROTARY_BASE}"
    if [ -z "$rotary" ] && [ -f "${HF_CHECKPOINT}/config.json" ]; then
        rotary="$("${PYTHON}" -c 'import json, sys
theta = json.load(open(sys.argv[1])).get("rope_theta")
print(int(theta) if theta else "")' "${HF_CHECKPOINT}/config.json" 2>/dev/null || true)"
    fi
    if [ -n "$rotary" ]; then
        local i found=0
        for i in "${!MODEL_ARGS[@]}"; do
            if [ "${MODEL_ARGS[$i]}" = "--rotary-base" ]; then
                MODEL_ARGS[i + 1]="$rotary"
                found=1
            fi
        done
        [ "$found" = 1 ] || MODEL_ARGS+=(--rotary-base "$rotary")
    fi
}

# ---------------------------------------------------------------------------------------------
# Preflight: collect every problem, then abort (or only report under DRY_RUN=1)
# ---------------------------------------------------------------------------------------------

SS_PREFLIGHT_ERRORS=()

ss_fail() { SS_PREFLIGHT_ERRORS+=("$*"); }

ss_preflight_finish() {
    local what="$1" msg
    if [ "${#SS_PREFLIGHT_ERRORS[@]}" -eq 0 ]; then
        ss_log "preflight (${what}): OK"
        return 0
    fi
    if ss_is_dry_run; then
        ss_warn "preflight (${what}): ${#SS_PREFLIGHT_ERRORS[@]} problem(s); a real run would stop here (DRY_RUN=1 continues):"
    else
        printf '[slime-strands] ERROR: preflight (%s) failed:\n' "$what" >&2
    fi
    for msg in "${SS_PREFLIGHT_ERRORS[@]}"; do
        printf '  - %s\n' "$msg" >&2
    done
    ss_is_dry_run || exit 1
}

ss_python_path() { printf '%s:%s:%s' "${MEGATRON_DIR}" "${SLIME_DIR}" "${SS_REPO_DIR}"; }

ss_check_python() {
    command -v "${PYTHON}" >/dev/null 2>&1 || ss_fail "${PYTHON} not found on PATH"
}

ss_check_slime() {
    if [ ! -d "${SLIME_DIR}" ]; then
        ss_fail "SLIME_DIR=${SLIME_DIR} does not exist: run inside the slimerl/slime image or set SLIME_DIR to a slime checkout"
        return
    fi
    [ -f "${SLIME_DIR}/train.py" ] || ss_fail "${SLIME_DIR}/train.py not found: SLIME_DIR must be the root of a slime checkout"
    [ -d "${MEGATRON_DIR}/megatron" ] || ss_fail "MEGATRON_DIR=${MEGATRON_DIR} has no megatron/ package: set MEGATRON_DIR to a Megatron-LM checkout"
    PYTHONPATH="$(ss_python_path)${PYTHONPATH:+:${PYTHONPATH}}" "${PYTHON}" -c "import slime.utils.arguments" >/dev/null 2>&1 ||
        ss_fail "slime is not importable with ${PYTHON} (PYTHONPATH=$(ss_python_path)): cd ${SLIME_DIR} && pip install -e . --no-deps"
}

# One interpreter start: the plugin's entry-point modules import, and the settings file validates.
ss_check_plugin() {
    if [ ! -f "${PLUGIN_CONFIG}" ]; then
        ss_fail "PLUGIN_CONFIG=${PLUGIN_CONFIG} does not exist"
        return
    fi
    local out line
    out="$(PYTHONPATH="${SS_REPO_DIR}${PYTHONPATH:+:${PYTHONPATH}}" "${PYTHON}" - "${PLUGIN_CONFIG}" 2>&1 <<'PY'
import importlib, sys
try:
    from slime_strands.settings import PluginSettings
    PluginSettings.from_yaml(sys.argv[1])
except Exception as exc:
    print("settings: %s: %s" % (type(exc).__name__, str(exc).replace("\n", " ")))
try:
    for name in ("slime_strands.rollout", "slime_strands.reward", "slime_strands.reward_norm", "slime_strands.metrics"):
        importlib.import_module(name)
except Exception as exc:
    print("import: %s: %s" % (type(exc).__name__, str(exc).replace("\n", " ")))
PY
)" || out="import: ${PYTHON} failed to run"
    while IFS= read -r line; do
        case "${line}" in
            import:*) ss_fail "slime_strands is not importable with ${PYTHON} (${line#import: }): pip install -e '${SS_REPO_DIR}[data,wandb,sandbox,math]'" ;;
            settings:*) ss_fail "plugin settings ${PLUGIN_CONFIG} are invalid: ${line#settings: }" ;;
        esac
    done <<<"${out}"
}

ss_check_gpus() {
    local need="$1"
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        ss_fail "nvidia-smi not found: no NVIDIA GPU visible (need ${need})"
        return
    fi
    local have
    have="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    [ "${have:-0}" -ge "$need" ] || ss_fail "nvidia-smi shows ${have:-0} GPU(s), this run needs ${need} per node (set NUM_GPUS)"
}

ss_check_ray() {
    command -v ray >/dev/null 2>&1 || ss_fail "the ray command is not on PATH (it ships with the slimerl/slime image)"
}

ss_check_hf_checkpoint() {
    [ -f "${HF_CHECKPOINT}/config.json" ] ||
        ss_fail "HF checkpoint ${HF_CHECKPOINT}/config.json missing: bash scripts/download_model.sh (or set HF_CHECKPOINT)"
}

ss_check_torch_dist() {
    [ -f "${TORCH_DIST_DIR}/latest_checkpointed_iteration.txt" ] ||
        ss_fail "torch_dist checkpoint ${TORCH_DIST_DIR} missing (no latest_checkpointed_iteration.txt): bash scripts/convert_hf_to_torch_dist.sh (or set TORCH_DIST_DIR)"
}

ss_check_data() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || ss_fail "data file ${f} missing or empty: bash scripts/prepare_data.sh (or set DATA_DIR / TRAIN_DATA / EVAL_DATA)"
    done
}

# ---------------------------------------------------------------------------------------------
# Preparation helpers (used by AUTO_PREPARE and by the helper scripts)
# ---------------------------------------------------------------------------------------------

ss_prepare_dataset() { # name out [split]
    local split=()
    [ -n "${3:-}" ] && split=(--split "$3")
    ss_run env PYTHONPATH="${SS_REPO_DIR}${PYTHONPATH:+:${PYTHONPATH}}" "${PYTHON}" -m data_prep.prepare \
        --dataset "$1" --out "$2" "${split[@]}"
}

# The configuration a helper script needs from the training script (whose defaults are not exported).
ss_helper_env() {
    local var assignments=()
    for var in DRY_RUN FORCE SLIME_DIR MEGATRON_DIR PYTHON MODEL_NAME MODEL_ORG HF_REPO MODELS_DIR \
        HF_CHECKPOINT TORCH_DIST_DIR SAVE_DIR MODEL_ARGS_NAME MODEL_ARGS_SOURCE MODEL_ARGS_ROTARY_BASE \
        DATA_DIR TRAIN_DATA EVAL_DATA CONVERT_NPROC SS_MODEL_ARGS_NOTED; do
        assignments+=("${var}=${!var}")
    done
    printf '%s\0' "${assignments[@]}"
}

ss_run_helper() { # script
    local vars=()
    mapfile -d '' vars < <(ss_helper_env)
    env "${vars[@]}" bash "${SS_SCRIPTS_DIR}/$1"
}

# Download / convert / prepare whatever the training run is missing (AUTO_PREPARE=1).
ss_auto_prepare() {
    if [ "${AUTO_PREPARE}" != 1 ]; then
        ss_log "AUTO_PREPARE=${AUTO_PREPARE}: not preparing missing checkpoints or data"
        return 0
    fi
    if [ ! -f "${HF_CHECKPOINT}/config.json" ]; then
        ss_log "HF checkpoint missing: downloading ${HF_REPO} (AUTO_PREPARE=0 disables this)"
        ss_run_helper download_model.sh
    fi
    if [ ! -f "${TORCH_DIST_DIR}/latest_checkpointed_iteration.txt" ]; then
        ss_log "torch_dist checkpoint missing: converting ${HF_CHECKPOINT} (AUTO_PREPARE=0 disables this)"
        ss_run_helper convert_hf_to_torch_dist.sh
    fi
    if [ ! -s "${TRAIN_DATA}" ]; then
        ss_log "training data missing: preparing ${TRAIN_DATA}"
        ss_prepare_dataset "${TRAIN_DATASET}" "${TRAIN_DATA}" "${TRAIN_SPLIT}"
    fi
    if [ ! -s "${EVAL_DATA}" ]; then
        ss_log "eval data missing: preparing ${EVAL_DATA}"
        ss_prepare_dataset "${EVAL_DATASET}" "${EVAL_DATA}" "${EVAL_SPLIT}"
    fi
}

# ---------------------------------------------------------------------------------------------
# Eval config: slime's --eval-config needs real data paths, so the template in configs/ is
# rendered into the run directory with DATA_DIR / EVAL_DATA applied (and kept there with the run).
# Paths under /root/data/ are re-rooted onto DATA_DIR; the dataset named EVAL_NAME (aime) gets EVAL_DATA;
# EVAL_N_SAMPLES / EVAL_MAX_RESPONSE_LEN override every dataset when set.
# ---------------------------------------------------------------------------------------------

ss_render_eval_config() { # template -> stdout
    DATA_DIR="${DATA_DIR}" EVAL_DATA="${EVAL_DATA}" EVAL_NAME="${EVAL_NAME}" EVAL_N_SAMPLES="${EVAL_N_SAMPLES}" \
        EVAL_MAX_RESPONSE_LEN="${EVAL_MAX_RESPONSE_LEN}" "${PYTHON}" - "$1" <<'PY'
import os, sys, yaml

doc = yaml.safe_load(open(sys.argv[1])) or {}
datasets = doc.get("eval", {}).get("datasets") or []
data_dir = os.environ["DATA_DIR"].rstrip("/")
for ds in datasets:
    path = str(ds.get("path", ""))
    if path.startswith("/root/data/"):
        ds["path"] = data_dir + path[len("/root/data"):]
    if ds.get("name") == os.environ["EVAL_NAME"] and os.environ.get("EVAL_DATA"):
        ds["path"] = os.environ["EVAL_DATA"]
    if os.environ.get("EVAL_N_SAMPLES"):
        ds["n_samples_per_eval_prompt"] = int(os.environ["EVAL_N_SAMPLES"])
    if os.environ.get("EVAL_MAX_RESPONSE_LEN"):
        ds["max_response_len"] = int(os.environ["EVAL_MAX_RESPONSE_LEN"])
sys.stdout.write("# Rendered by slime-strands from %s; edit the template, not this file.\n" % sys.argv[1])
yaml.safe_dump(doc, sys.stdout, sort_keys=False)
PY
}

# ---------------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------------

SS_STARTED_RAY=0
SS_JOB_ID=""
SS_JOB_DONE=0

ss_cleanup() {
    local rc=$?
    if [ -n "${SS_JOB_ID}" ] && [ "${SS_JOB_DONE}" != 1 ]; then
        ss_warn "stopping the Ray job ${SS_JOB_ID} this script submitted"
        ray job stop --address "http://127.0.0.1:${RAY_DASHBOARD_PORT}" "${SS_JOB_ID}" >/dev/null 2>&1 || true
    fi
    if [ "${SS_STARTED_RAY}" = 1 ]; then
        if [ "${KEEP_RAY}" = 1 ]; then
            ss_log "KEEP_RAY=1: leaving the Ray head this script started running (stop it with: ray stop)"
        else
            ss_log "stopping the Ray head this script started"
            ray stop >/dev/null 2>&1 || true
        fi
    fi
    return "$rc"
}

ss_on_signal() {
    ss_warn "interrupted"
    exit 130
}

ss_ray_running() { ray status --address "${MASTER_ADDR}:${RAY_PORT}" >/dev/null 2>&1; }

ss_cluster_gpus() {
    "${PYTHON}" -c 'import ray, sys
ray.init(address=sys.argv[1], logging_level="ERROR")
print(int(ray.cluster_resources().get("GPU", 0)))' "${MASTER_ADDR}:${RAY_PORT}" 2>/dev/null || echo 0
}

ss_start_ray_head() {
    local cmd=(ray start --head --node-ip-address "${MASTER_ADDR}" --port "${RAY_PORT}" --num-gpus "${NUM_GPUS}"
        --disable-usage-stats --dashboard-host 0.0.0.0 --dashboard-port "${RAY_DASHBOARD_PORT}")
    if ss_is_dry_run; then
        ss_print_cmd "${cmd[@]}"
        return 0
    fi
    if ss_ray_running; then
        ss_log "a Ray cluster is already running at ${MASTER_ADDR}:${RAY_PORT}: submitting to it (it will not be stopped)"
        return 0
    fi
    SS_STARTED_RAY=1
    ss_run "${cmd[@]}"
}

ss_join_command() {
    printf 'MASTER_ADDR=%q RAY_PORT=%q NUM_GPUS=%q bash %q' "${MASTER_ADDR}" "${RAY_PORT}" "${NUM_GPUS}" \
        "${SS_SCRIPTS_DIR}/join_worker.sh"
}

ss_wait_for_workers() {
    [ "${NUM_NODES}" -gt 1 ] || return 0
    local want=$((NUM_NODES * NUM_GPUS))
    ss_log "waiting for $((NUM_NODES - 1)) worker node(s); on each of them run:"
    ss_log "  $(ss_join_command)"
    ss_is_dry_run && return 0
    local waited=0 have
    while :; do
        have="$(ss_cluster_gpus)"
        [ "${have}" -ge "${want}" ] && break
        [ "${waited}" -ge "${WAIT_FOR_WORKERS_S}" ] &&
            ss_die "only ${have}/${want} GPUs joined after ${WAIT_FOR_WORKERS_S}s (WAIT_FOR_WORKERS_S): start the workers with the command above"
        sleep 10
        waited=$((waited + 10))
    done
    ss_log "cluster ready: ${have} GPUs"
}

# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

ss_has_nvlink() {
    local count
    count="$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l || true)"
    if [ "${count:-0}" -gt 0 ]; then echo 1; else echo 0; fi
}

ss_runtime_env_json() {
    "${PYTHON}" -c 'import json, sys
print(json.dumps({"env_vars": {
    "PYTHONPATH": sys.argv[1],
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "NCCL_NVLS_ENABLE": sys.argv[2],
    "PYTHONUNBUFFERED": "1",
}}))' "$(ss_python_path)" "$1"
}

# train.py's flags, one group per function, each setting an array (SS_<GROUP>_ARGS). The GPU recipes
# (ss_build_train_args) and the CPU smoke (scripts/slime_cpu_smoke.sh: slime's own train.py on a CPU) both
# compose them, so the plugin's flags and the rollout, partial-rollout, eval and wandb settings are written once.

# Data, batch and sampling; with PARTIAL_ROLLOUT=1 slime's over-sampling and abort.
ss_rollout_args() {
    SS_ROLLOUT_ARGS=(--prompt-data "${TRAIN_DATA}" --input-key prompt --label-key label --rollout-shuffle
        --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size "${ROLLOUT_BATCH_SIZE}"
        --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}" --rollout-max-response-len "${MAX_RESPONSE_LEN}"
        --rollout-temperature "${ROLLOUT_TEMPERATURE}" --global-batch-size "${GLOBAL_BATCH_SIZE}" --balance-data)
    if [ -n "${MAX_CONTEXT_LEN}" ]; then
        SS_ROLLOUT_ARGS+=(--rollout-max-context-len "${MAX_CONTEXT_LEN}")
    fi
    if [ -n "${MULTIMODAL_KEYS}" ]; then
        SS_ROLLOUT_ARGS+=(--multimodal-keys "${MULTIMODAL_KEYS}")
    fi
    if [ "${PARTIAL_ROLLOUT}" = 1 ]; then
        SS_ROLLOUT_ARGS+=(--partial-rollout
            --over-sampling-batch-size "${OVER_SAMPLING_BATCH_SIZE:-$((ROLLOUT_BATCH_SIZE * 3 / 2))}")
        if [ "${MASK_OFFPOLICY}" = 1 ]; then
            SS_ROLLOUT_ARGS+=(--mask-offpolicy-in-partial-rollout)
        fi
    fi
}

ss_eval_args() { # eval_config_path
    SS_EVAL_ARGS=(--eval-interval "${EVAL_INTERVAL}" --eval-config "$1")
}

# Online with WANDB_KEY, else offline into WANDB_DIR.
ss_wandb_args() {
    SS_WANDB_ARGS=(--use-wandb --wandb-project "${WANDB_PROJECT}" --wandb-group "${WANDB_GROUP}"
        --wandb-dir "${WANDB_DIR}")
    if [ -n "${WANDB_KEY}" ]; then
        SS_WANDB_ARGS+=(--wandb-key "${WANDB_KEY}")
    else
        SS_WANDB_ARGS+=(--wandb-mode offline)
    fi
}

# The plugin: agent rollout, shaped training reward, GRPO groups without their FAILED samples, metrics, and
# its settings file. No --apply-chat-template: the agent renders the chat itself (the plugin refuses it).
ss_plugin_args() {
    SS_PLUGIN_ARGS=(--custom-generate-function-path slime_strands.rollout.generate
        --custom-rm-path "${REWARD_PATH}"
        --custom-reward-post-process-path slime_strands.reward_norm.post_process_rewards
        --custom-rollout-log-function-path slime_strands.metrics.log_rollout
        --custom-eval-rollout-log-function-path slime_strands.metrics.log_eval_rollout
        --custom-config-path "${PLUGIN_CONFIG}" --log-passrate)
}

# Build TRAIN_ARGS (the arguments of slime's train.py on GPUs) from the configuration.
ss_build_train_args() { # eval_config_path
    local eval_config="$1"
    local cluster=(--actor-num-nodes "${NUM_NODES}" --actor-num-gpus-per-node "${NUM_GPUS}"
        --num-gpus-per-node "${NUM_GPUS}" --colocate)
    local ckpt=(--hf-checkpoint "${HF_CHECKPOINT}" --ref-load "${TORCH_DIST_DIR}"
        --load "${SAVE_DIR}" --save "${SAVE_DIR}" --save-interval "${SAVE_INTERVAL}")
    local perf=(--tensor-model-parallel-size "${TP_SIZE}" --sequence-parallel --pipeline-model-parallel-size 1
        --context-parallel-size 1 --expert-model-parallel-size 1 --expert-tensor-parallel-size 1
        --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
        --use-dynamic-batch-size --max-tokens-per-gpu "${MAX_TOKENS_PER_GPU}")
    local grpo=(--advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl
        --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28)
    local optimizer=(--optimizer adam --lr "${LR}" --lr-decay-style constant --weight-decay 0.1
        --adam-beta1 0.9 --adam-beta2 0.98)
    local sglang=(--rollout-num-gpus-per-engine "${ROLLOUT_GPUS_PER_ENGINE}"
        --sglang-mem-fraction-static "${SGLANG_MEM_FRACTION}")
    local misc=(--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32
        --attention-softmax-in-fp32 --attention-backend flash)
    ss_rollout_args
    ss_eval_args "${eval_config}"
    ss_wandb_args
    ss_plugin_args
    local extra=()
    # EXTRA_TRAIN_ARGS is split on whitespace (no quoting inside it).
    [ -n "${EXTRA_TRAIN_ARGS}" ] && read -r -a extra <<<"${EXTRA_TRAIN_ARGS}"
    TRAIN_ARGS=("${cluster[@]}" "${MODEL_ARGS[@]}" "${ckpt[@]}" "${SS_ROLLOUT_ARGS[@]}" "${SS_EVAL_ARGS[@]}"
        "${perf[@]}" "${grpo[@]}" "${optimizer[@]}" "${SS_WANDB_ARGS[@]}" "${sglang[@]}" "${misc[@]}"
        "${SS_PLUGIN_ARGS[@]}" "${extra[@]}" "${SS_CLI_ARGS[@]}")
}

# The whole training flow of scripts/strands_qwen3_*.sh. Arguments are appended to train.py's
# (after EXTRA_TRAIN_ARGS; argparse keeps the last value of a repeated flag).
SS_CLI_ARGS=()
ss_train_main() {
    SS_CLI_ARGS=("$@")
    ss_defaults
    if [ -z "${MASTER_ADDR}" ]; then
        if [ "${NUM_NODES}" -gt 1 ]; then
            MASTER_ADDR="$(hostname -I 2>/dev/null | awk '{print $1}')"
            [ -n "${MASTER_ADDR}" ] || MASTER_ADDR=127.0.0.1
        else
            MASTER_ADDR=127.0.0.1
        fi
    fi
    # slime reads --custom-config-path from the job's working directory: always pass an absolute path.
    [ -d "$(dirname "${PLUGIN_CONFIG}")" ] || ss_die "PLUGIN_CONFIG=${PLUGIN_CONFIG}: directory does not exist"
    PLUGIN_CONFIG="$(cd "$(dirname "${PLUGIN_CONFIG}")" && pwd)/$(basename "${PLUGIN_CONFIG}")"
    ss_is_dry_run && ss_log "DRY_RUN=1: printing the commands, running nothing"
    ss_log "model ${HF_REPO} on ${NUM_NODES} node(s) x ${NUM_GPUS} GPU(s); checkpoint ${HF_CHECKPOINT}; run dir ${SAVE_DIR}"
    ss_pick_model_args # said here, once: the conversion ss_auto_prepare may run reads the same file

    ss_auto_prepare
    # After preparing: the rotary base is read from the (possibly just downloaded) config.json.
    ss_load_model_args

    SS_PREFLIGHT_ERRORS=()
    ss_check_python
    ss_check_slime
    ss_check_plugin
    ss_check_ray
    ss_check_gpus "${NUM_GPUS}"
    ss_check_hf_checkpoint
    ss_check_torch_dist
    ss_check_data "${TRAIN_DATA}" "${EVAL_DATA}"
    [ -f "${EVAL_CONFIG_TEMPLATE}" ] || ss_fail "EVAL_CONFIG_TEMPLATE=${EVAL_CONFIG_TEMPLATE} does not exist"
    if [ "${NUM_NODES}" -gt 1 ] && [ "${MASTER_ADDR}" = 127.0.0.1 ]; then
        ss_fail "NUM_NODES=${NUM_NODES} needs MASTER_ADDR set to this node's IP address reachable from the workers"
    fi
    ss_preflight_finish training
    [ -n "${WANDB_KEY}" ] || ss_log "no WANDB_KEY: wandb logs offline into ${WANDB_DIR} (upload later: wandb sync ${WANDB_DIR}/wandb/offline-run-*)"

    local run_config_dir="${SAVE_DIR}/run_config"
    local eval_config="${run_config_dir}/${EVAL_CONFIG_TEMPLATE##*/}"
    if ss_is_dry_run; then
        ss_log "would write ${eval_config}:"
        ss_render_eval_config "${EVAL_CONFIG_TEMPLATE}" | sed 's/^/    /' >&2 || ss_warn "could not render ${EVAL_CONFIG_TEMPLATE}"
    else
        mkdir -p "${run_config_dir}" "${WANDB_DIR}"
        ss_render_eval_config "${EVAL_CONFIG_TEMPLATE}" >"${eval_config}.tmp"
        mv "${eval_config}.tmp" "${eval_config}"
        ss_log "eval config: ${eval_config}"
    fi

    ss_build_train_args "${eval_config}"
    local has_nvlink runtime_env
    has_nvlink="$(ss_has_nvlink)"
    runtime_env="$(ss_runtime_env_json "${has_nvlink}")"
    SS_JOB_ID="slime-strands-$(echo "${MODEL_NAME}" | tr '[:upper:]' '[:lower:]')-$(date +%Y%m%d-%H%M%S)"
    local submit=(ray job submit --address "http://127.0.0.1:${RAY_DASHBOARD_PORT}" --submission-id "${SS_JOB_ID}"
        --runtime-env-json "${runtime_env}" -- "${PYTHON}" "${SLIME_DIR}/train.py" "${TRAIN_ARGS[@]}")

    if ss_is_dry_run; then
        ss_start_ray_head
        ss_wait_for_workers
        ss_print_cmd "${submit[@]}"
        SS_JOB_ID=""
        return 0
    fi

    trap ss_cleanup EXIT
    trap ss_on_signal INT TERM
    # The job's driver inherits the Ray head's working directory: start it from slime's checkout.
    cd "${SLIME_DIR}" || ss_die "cannot cd to SLIME_DIR=${SLIME_DIR}"
    ss_start_ray_head
    ss_wait_for_workers
    ss_print_cmd "${submit[@]}" >"${run_config_dir}/command.txt"
    ss_log "submitting Ray job ${SS_JOB_ID} (command saved in ${run_config_dir}/command.txt)"
    local rc=0
    ss_run "${submit[@]}" || rc=$?
    SS_JOB_DONE=1
    [ "$rc" = 0 ] || ss_die "the Ray job ${SS_JOB_ID} failed (exit ${rc}); logs: ray job logs --address http://127.0.0.1:${RAY_DASHBOARD_PORT} ${SS_JOB_ID}"
    ss_log "done: checkpoints in ${SAVE_DIR}; convert with: CKPT_DIR=${SAVE_DIR} bash ${SS_SCRIPTS_DIR}/convert_torch_dist_to_hf.sh"
}
