#!/usr/bin/env bash
# slime's OWN train.py, end to end on a CPU, with the plugin exactly as the Qwen3 recipes launch it, against the
# REAL SGLang 0.5.23 server: run it before renting GPUs.
#
#     bash scripts/slime_cpu_smoke.sh OUT_DIR
#
# It builds what it needs (idempotent: an unchanged build is kept) under SMOKE_CACHE (default
# ~/.cache/slime-strands): the SGLang server's venv and the driver's venv (scripts/slime_cpu/build_driver_venv.sh),
# with slime's unmodified source and the Megatron-LM snapshot slime pins from ../shared beside the checkout
# (SLIME_SOURCE / MEGATRON_TARBALL). Then it starts, each by its own pid and stopped by it at the end:
#   * the real SGLang server on a tiny random-weight Qwen3 (the real-SGLang tier's venv, model and flags) with a
#     recording proxy in front (tests/slime_train/serve.py), which slime's router is pointed at;
#   * a private Ray head (free ports, its own temp dir and auth token, one fake GPU, its dashboard on 127.0.0.1 for
#     Ray's state API);
# and runs slime's train.py --debug-rollout-only with the recipe's plugin flags and settings file
# (scripts/lib/common.sh builds both flag lists), the smoke's overlay added to the settings
# (scripts/slime_cpu/smoke_settings.yaml, or SMOKE_SETTINGS=path for another variant: a grammar for the model, the
# sandbox on a Ray pool inside slime's cluster), over-sampling with partial rollout, AIME-format eval and offline
# wandb. No training step: Megatron's model needs a GPU. Once train.py has exited, and before the Ray head stops,
# scripts/slime_cpu/record_ray_state.py records what the cluster still holds.
#
# OUT_DIR gets: rollout_{id}.pt and rollout_eval_{id}.pt (slime's --save-debug-rollout-data), train.log (the whole
# train.py log), requests.jsonl (every request slime's router sent the server, and its answer), wandb/ (the
# offline runs) and wandb_history.jsonl (their rows as JSON), ray_state.json (the cluster's actors and the sandbox
# pool's executions by Ray's account, and sandbox processes left, after train.py), server.log, ray.log, run_config/
# (the settings, eval config and the exact train.py command), data/, model/, smoke.json (what ran, for
# tests/slime_train). OUT_DIR must be new, empty, or an earlier smoke's (which is cleared). Any failure stops the
# smoke with one [slime-strands] ERROR line and a non-zero status, after stopping what it started. The long
# phases (the venvs' builds, the server's and the Ray head's start, train.py) say every SMOKE_TICK_S seconds (30)
# what they are doing and for how long (scripts/lib/progress.sh); at the end, the lines of the logs that read as
# failures but are expected are counted, each with what it means (scripts/slime_cpu/expected_lines.sh).
#
# Configurations (SMOKE_CONFIG, one per run; CI runs each into its own OUT_DIR, tests/slime_train checks each):
#   sync (default): slime's default rollout function (sglang_rollout.generate_rollout) with over-sampling and
#       partial rollout: slime aborts the slowest groups when a step has its batch; overlay smoke_settings.yaml.
#   async_workers: slime's fully-async rollout function (--rollout-function-path
#       slime.rollout.fully_async_rollout.generate_rollout_fully_async: its own event loop on a background thread,
#       groups in flight across steps, ABORTED groups back to the data buffer), eval through slime's default
#       function on slime's main loop (the fully-async one refuses eval), episodes on two rollout workers (overlay
#       smoke_workers.yaml), partial rollout, and between steps the abort slime's weight update sends (skipped by
#       --debug-rollout-only): scripts/slime_cpu/abort_between_steps.py posts /abort_request for all to the
#       server once each step but the last is saved. SGLANG_SERVER_CONCURRENCY (4) groups in flight. Eval runs
#       once, before the first step (EVAL_INTERVAL defaults past NUM_ROLLOUT): slime's GenerateState holds ONE
#       asyncio.Semaphore for both loops, and once one loop has waited on it, the other waiting too raises
#       "bound to a different event loop" (docs/slime.md, "Fully-async training with agents").
#
# Knobs (environment): the run's size NUM_ROLLOUT (4), ROLLOUT_BATCH_SIZE (2), N_SAMPLES_PER_PROMPT (2),
# OVER_SAMPLING_BATCH_SIZE (4), MAX_RESPONSE_LEN (512), EVAL_PROMPTS (2), EVAL_N_SAMPLES (2); SMOKE_TIMEOUT_S
# (1800, train.py's time limit); SMOKE_TICK_S (30, seconds between a long phase's progress lines);
# SLIME_STRANDS_SGLANG_PYTHON (a server venv's python to use instead of building one, e.g. the real-SGLang tier's).
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: bash scripts/slime_cpu_smoke.sh OUT_DIR" >&2
    exit 2
fi
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=lib/progress.sh
source "${SS_SCRIPTS_DIR}/lib/progress.sh"
# shellcheck source=slime_cpu/expected_lines.sh
source "${SS_SCRIPTS_DIR}/slime_cpu/expected_lines.sh"

SMOKE_DIR="${SS_SCRIPTS_DIR}/slime_cpu"
SMOKE_MARKER=".slime-cpu-smoke"
: "${SMOKE_CACHE:=${XDG_CACHE_HOME:-${HOME}/.cache}/slime-strands}"
: "${SMOKE_CONFIG:=sync}"
case "${SMOKE_CONFIG}" in
    sync)
        : "${SMOKE_SETTINGS:=${SMOKE_DIR}/smoke_settings.yaml}"
        SMOKE_ROLLOUT=sync
        ;;
    async_workers)
        : "${SMOKE_SETTINGS:=${SMOKE_DIR}/smoke_workers.yaml}"
        SMOKE_ROLLOUT=fully_async
        : "${SGLANG_SERVER_CONCURRENCY:=4}"
        : "${EVAL_INTERVAL:=1000}"
        ;;
    *)
        echo "[slime-strands] ERROR: SMOKE_CONFIG=${SMOKE_CONFIG}: the smoke's configurations are async_workers and sync" >&2
        exit 2
        ;;
esac
: "${SGLANG_SERVER_CONCURRENCY:=}" # empty: slime's default
: "${SMOKE_TIMEOUT_S:=1800}"
: "${SMOKE_TICK_S:=30}"
SS_TICK_S="${SMOKE_TICK_S}"
: "${EVAL_PROMPTS:=2}"
# The recipe's knobs, at the smoke's size (common.sh's ss_defaults fills in the rest).
: "${NUM_ROLLOUT:=4}"
: "${ROLLOUT_BATCH_SIZE:=2}"
: "${N_SAMPLES_PER_PROMPT:=2}"
: "${GLOBAL_BATCH_SIZE:=$((ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT))}"
: "${MAX_RESPONSE_LEN:=512}"
: "${PARTIAL_ROLLOUT:=1}"
: "${OVER_SAMPLING_BATCH_SIZE:=$((ROLLOUT_BATCH_SIZE * 2))}"
: "${EVAL_INTERVAL:=${NUM_ROLLOUT}}"
: "${EVAL_N_SAMPLES:=2}"
: "${EVAL_MAX_RESPONSE_LEN:=${MAX_RESPONSE_LEN}}"
: "${MODEL_NAME:=tiny-qwen3}"
: "${MODEL_ARGS_NAME:=tiny-qwen3}"
: "${MODEL_ARGS_SOURCE:=bundled}"
: "${WANDB_GROUP:=slime-cpu-smoke}"

SMOKE_SERVE_PID=""
SMOKE_RAY_PID=""
SMOKE_TRAIN_PID=""
SMOKE_ABORT_PID=""
SMOKE_RAY_TMP=""

# ---------------------------------------------------------------------------------------------
# Stopping what the smoke started: its own process groups, by pid, with bounds
# ---------------------------------------------------------------------------------------------

smoke_group_alive() { pgrep -g "$1" >/dev/null 2>&1; }

# SIGTERM to the group led by $1 (started with setsid), up to $2 seconds, then SIGKILL.
smoke_stop_group() { # pgid grace_s what
    local pgid="$1" grace="$2" waited=0
    smoke_group_alive "$pgid" || return 0
    kill -TERM -- "-${pgid}" 2>/dev/null || true
    while smoke_group_alive "$pgid" && [ "$waited" -lt "$grace" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if smoke_group_alive "$pgid"; then
        ss_warn "$3 did not stop within ${grace}s: killing its process group ${pgid}"
        kill -KILL -- "-${pgid}" 2>/dev/null || true
    fi
}

# Both stop at once (each takes tens of seconds); the server's group gets its own SIGTERM first, so its
# supervisor writes requests.jsonl before anything is killed.
smoke_cleanup() {
    local rc=$?
    local pids=()
    ss_tick_stop
    if [ -n "${SMOKE_TRAIN_PID}" ]; then # interrupted while train.py ran
        smoke_stop_group "${SMOKE_TRAIN_PID}" 30 "train.py"
        SMOKE_TRAIN_PID=""
    fi
    smoke_stop_aborts
    if [ -n "${SMOKE_RAY_PID}" ]; then
        smoke_stop_group "${SMOKE_RAY_PID}" 60 "the Ray head" &
        pids+=($!)
        SMOKE_RAY_PID=""
    fi
    if [ -n "${SMOKE_SERVE_PID}" ]; then
        smoke_stop_group "${SMOKE_SERVE_PID}" 90 "the SGLang server" &
        pids+=($!)
        SMOKE_SERVE_PID=""
    fi
    [ "${#pids[@]}" = 0 ] || wait "${pids[@]}" || true
    if [ -n "${SMOKE_RAY_TMP}" ]; then
        smoke_kill_leftovers "RAY_AUTH_TOKEN_PATH=${SMOKE_RAY_TMP}/token"
        rm -rf "${SMOKE_RAY_TMP}"
    fi
    return "$rc"
}

# A Ray worker stuck on its way out (seen: slime's MegatronTrainRayActor in a futex wait, reparented to init)
# leaves the head's process group and survives it. Every process of this run's private cluster inherited its
# token path ($1, unique per run): whatever still carries it once everything stopped is killed, and named.
smoke_kill_leftovers() { # environment entry
    local entry pid
    for entry in /proc/[0-9]*/environ; do
        pid="${entry#/proc/}"
        pid="${pid%/environ}"
        [ "${pid}" != "$$" ] || continue
        if tr '\0' '\n' 2>/dev/null <"${entry}" | grep -qxF -- "$1"; then
            ss_warn "killing a process of the run's Ray cluster that outlived it: ${pid} ($(tr '\0' ' ' 2>/dev/null <"/proc/${pid}/cmdline"))"
            kill -KILL "${pid}" 2>/dev/null || true
        fi
    done
}

# ---------------------------------------------------------------------------------------------
# Steps
# ---------------------------------------------------------------------------------------------

smoke_prepare_out() { # dir
    mkdir -p "$1" || ss_die "cannot create OUT_DIR=$1"
    OUT="$(cd "$1" && pwd)"
    if [ -n "$(ls -A "${OUT}")" ]; then
        [ -f "${OUT}/${SMOKE_MARKER}" ] ||
            ss_die "OUT_DIR=${OUT} is not empty and not an earlier smoke's: give a new or empty folder"
        find "${OUT}" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
    fi
    touch "${OUT}/${SMOKE_MARKER}"
    mkdir -p "${OUT}/run_config" "${OUT}/data"
}

smoke_build() {
    local server_python="${SLIME_STRANDS_SGLANG_PYTHON:-}"
    if [ -z "${server_python}" ]; then
        ss_log "building (or checking) the SGLang server venv in ${SMOKE_CACHE}/sglang-venv (first time: minutes, ~6 GB)"
        ss_tick_start "building the SGLang server venv (pip installs SGLang and torch)"
        server_python="$(bash "${SS_SCRIPTS_DIR}/real_sglang/build_venv.sh" "${SMOKE_CACHE}/sglang-venv" | tail -n 1)" ||
            ss_die "the SGLang server venv did not build (scripts/real_sglang/build_venv.sh)"
        ss_tick_stop
    fi
    [ -x "${server_python}" ] || ss_die "the SGLang server's python ${server_python} is not executable"
    SERVER_PYTHON="${server_python}"
    ss_log "building (or checking) the driver venv in ${SMOKE_CACHE}/slime-driver-venv (first time: ~8 minutes)"
    ss_tick_start "building the driver venv (pip installs slime's requirements, then imports what train.py imports)"
    PYTHON="$(bash "${SMOKE_DIR}/build_driver_venv.sh" "${SMOKE_CACHE}/slime-driver-venv" "${SERVER_PYTHON}" | tail -n 1)" ||
        ss_die "the driver venv did not build (scripts/slime_cpu/build_driver_venv.sh)"
    ss_tick_stop
    SLIME_DIR="$(cd "${SLIME_SOURCE:-${SS_REPO_DIR}/../shared/slime}" && pwd)"
}

# Training prompts: the demo set (dapo-math-17k's format, offline); eval: its first EVAL_PROMPTS rows, the
# format of AIME-2024 as data_prep writes it.
smoke_data() {
    TRAIN_DATA="${OUT}/data/train.jsonl"
    EVAL_DATA="${OUT}/data/eval_aime_format.jsonl"
    (cd "${SS_REPO_DIR}" && "${PYTHON}" -m data_prep.prepare --dataset demo --out "${TRAIN_DATA}") \
        >"${OUT}/data/prepare.log" 2>&1 || ss_die "data_prep failed: see ${OUT}/data/prepare.log"
    head -n "${EVAL_PROMPTS}" "${TRAIN_DATA}" >"${EVAL_DATA}"
}

smoke_configs() {
    [ -f "${SMOKE_SETTINGS}" ] || ss_die "SMOKE_SETTINGS=${SMOKE_SETTINGS} does not exist"
    PLUGIN_CONFIG="${OUT}/run_config/strands_settings.yaml"
    "${PYTHON}" "${SMOKE_DIR}/render_settings.py" "${SS_REPO_DIR}/configs/strands_math.yaml" "${SMOKE_SETTINGS}" \
        "${PLUGIN_CONFIG}" || ss_die "the smoke's settings are invalid (above)"
    EVAL_CONFIG="${OUT}/run_config/eval_aime.yaml"
    ss_render_eval_config "${EVAL_CONFIG_TEMPLATE}" >"${EVAL_CONFIG}" || ss_die "could not render ${EVAL_CONFIG_TEMPLATE}"
}

smoke_free_port() { "${PYTHON}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits (bounded) until file $1 is non-empty while process $2 lives.
smoke_wait_file() { # file pid timeout_s what log
    local waited=0
    while [ ! -s "$1" ]; do
        kill -0 "$2" 2>/dev/null || ss_die "$4 exited before it was ready; the end of $5:
$(tail -n 40 "$5" 2>/dev/null)"
        [ "${waited}" -lt "$3" ] || ss_die "$4 was not ready after $3 s; see $5"
        sleep 1
        waited=$((waited + 1))
    done
}

smoke_start_server() {
    ss_log "starting the SGLang server (tiny random-weight Qwen3) and its recording proxy"
    local address_file="${OUT}/run_config/server_address"
    setsid "${PYTHON}" "${SS_REPO_DIR}/tests/slime_train/serve.py" --sglang-python "${SERVER_PYTHON}" \
        --model-dir "${OUT}/model" --log "${OUT}/server.log" --record "${OUT}/requests.jsonl" \
        --address-file "${address_file}" >"${OUT}/serve.log" 2>&1 </dev/null &
    SMOKE_SERVE_PID=$!
    ss_tick_start "starting the SGLang server (it loads the model and warms up; log: ${OUT}/server.log)"
    smoke_wait_file "${address_file}" "${SMOKE_SERVE_PID}" 900 "the SGLang server" "${OUT}/serve.log"
    ss_tick_stop
    SERVER_ADDRESS="$(cat "${address_file}")"
    HF_CHECKPOINT="${OUT}/model"
    ss_log "server ready behind ${SERVER_ADDRESS}"
}

# A private Ray head: free ports, its own temp dir, token authentication with its own token (a token in ~/.ray
# would otherwise switch it on for one side only), one fake GPU (slime's placement group asks for one), the cpu
# accelerator switched on for every worker it starts, and its dashboard on 127.0.0.1 (it serves Ray's state API,
# which smoke_record_ray reads).
smoke_start_ray() {
    SMOKE_RAY_TMP="$(mktemp -d /tmp/ss-ray.XXXXXX)" # short: Ray's socket paths must fit in 107 bytes
    "${PYTHON}" -c 'import secrets; print(secrets.token_hex(32))' >"${SMOKE_RAY_TMP}/token"
    chmod 600 "${SMOKE_RAY_TMP}/token"
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="${SMOKE_RAY_TMP}/token" SLIME_STRANDS_CPU_ACCELERATOR=1
    RAY_PORT="$(smoke_free_port)"
    local ray_bin
    ray_bin="$(dirname "${PYTHON}")/ray"
    ss_log "starting a private Ray head on 127.0.0.1:${RAY_PORT}"
    setsid "${ray_bin}" start --head --block --node-ip-address 127.0.0.1 --port "${RAY_PORT}" \
        --ray-client-server-port "$(smoke_free_port)" --dashboard-agent-listen-port "$(smoke_free_port)" \
        --metrics-export-port "$(smoke_free_port)" --num-cpus 4 --num-gpus 1 --disable-usage-stats \
        --include-dashboard true --dashboard-host 127.0.0.1 --dashboard-port "$(smoke_free_port)" \
        --temp-dir "${SMOKE_RAY_TMP}" >"${OUT}/ray.log" 2>&1 </dev/null &
    SMOKE_RAY_PID=$!
    ss_tick_start "starting the Ray head (log: ${OUT}/ray.log)"
    local waited=0
    until "${ray_bin}" status --address "127.0.0.1:${RAY_PORT}" >/dev/null 2>&1; do
        kill -0 "${SMOKE_RAY_PID}" 2>/dev/null || ss_die "the Ray head exited; the end of ${OUT}/ray.log:
$(tail -n 40 "${OUT}/ray.log")"
        [ "${waited}" -lt 180 ] || ss_die "the Ray head did not answer within 180 s; see ${OUT}/ray.log"
        sleep 2
        waited=$((waited + 2))
    done
    ss_tick_stop
}

# The fully-async configuration's stand-in for slime's weight update between steps (abort_between_steps.py).
smoke_start_aborts() {
    [ "${SMOKE_ROLLOUT}" = fully_async ] || return 0
    "${PYTHON}" "${SMOKE_DIR}/abort_between_steps.py" "${OUT}" "${SERVER_ADDRESS}" "${NUM_ROLLOUT}" \
        >"${OUT}/run_config/aborts.log" 2>&1 </dev/null &
    SMOKE_ABORT_PID=$!
}

smoke_stop_aborts() {
    [ -n "${SMOKE_ABORT_PID}" ] || return 0
    kill -TERM "${SMOKE_ABORT_PID}" 2>/dev/null || true
    wait "${SMOKE_ABORT_PID}" 2>/dev/null || true
    SMOKE_ABORT_PID=""
}

# train.py's arguments: the CPU-only ones here, every other group from common.sh (the recipe's own lists).
smoke_train_args() {
    ss_load_model_args
    ss_rollout_args
    ss_eval_args "${EVAL_CONFIG}"
    ss_wandb_args
    ss_plugin_args
    TRAIN_ARGS=(--debug-rollout-only --rollout-external-engine-addrs "${SERVER_ADDRESS}"
        --actor-num-nodes 1 --actor-num-gpus-per-node 1 --num-gpus-per-node 1
        --hf-checkpoint "${HF_CHECKPOINT}" "${MODEL_ARGS[@]}" --advantage-estimator grpo
        "${SS_ROLLOUT_ARGS[@]}" "${SS_EVAL_ARGS[@]}" "${SS_WANDB_ARGS[@]}" "${SS_PLUGIN_ARGS[@]}"
        --save-debug-rollout-data "${OUT}/rollout_{rollout_id}.pt")
    if [ "${SMOKE_ROLLOUT}" = fully_async ]; then
        TRAIN_ARGS+=(--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async
            --eval-function-path slime.rollout.sglang_rollout.generate_rollout
            --sglang-server-concurrency "${SGLANG_SERVER_CONCURRENCY}")
    fi
}

# train.py runs in a session of its own (its pid leads the group of timeout and the driver), in the
# background so that a signal reaches this script's trap at once instead of after train.py.
smoke_train() {
    smoke_train_args
    local cmd=(timeout --signal=TERM --kill-after=60 "${SMOKE_TIMEOUT_S}" "${PYTHON}" train.py "${TRAIN_ARGS[@]}")
    ss_print_cmd "${cmd[@]}" >"${OUT}/run_config/command.txt"
    ss_log "running slime's train.py (log: ${OUT}/train.log; command: ${OUT}/run_config/command.txt)"
    local rc=0 started=${SECONDS}
    (cd "${SLIME_DIR}" && RAY_ADDRESS="127.0.0.1:${RAY_PORT}" exec setsid "${cmd[@]}") >"${OUT}/train.log" 2>&1 </dev/null &
    SMOKE_TRAIN_PID=$!
    ss_tick_start "running slime's train.py (log: ${OUT}/train.log)" smoke_train_status
    smoke_start_aborts
    wait "${SMOKE_TRAIN_PID}" || rc=$?
    ss_tick_stop
    SMOKE_TRAIN_PID=""
    smoke_stop_aborts
    TRAIN_SECONDS=$((SECONDS - started))
    if [ "${rc}" = 124 ]; then
        ss_die "train.py did not finish within SMOKE_TIMEOUT_S=${SMOKE_TIMEOUT_S} s; see ${OUT}/train.log"
    fi
    [ "${rc}" = 0 ] || ss_die "train.py failed (exit ${rc}) after ${TRAIN_SECONDS} s; the end of ${OUT}/train.log:
$(tail -n 60 "${OUT}/train.log")"
    ss_log "train.py finished in ${TRAIN_SECONDS} s"
}

# What train.py is at, for its progress line: the rollouts it saved so far.
smoke_train_status() {
    local saved=("${OUT}"/rollout_[0-9]*.pt)
    [ -e "${saved[0]}" ] || saved=()
    printf '%d of %d rollouts saved' "${#saved[@]}" "${NUM_ROLLOUT}"
}

# train.py has exited, the Ray head still runs: what its actors and the sandbox pool left (tests/slime_train says
# whether that is nothing).
smoke_record_ray() {
    ss_log "recording what the Ray cluster holds after train.py (${OUT}/ray_state.json)"
    RAY_ADDRESS="127.0.0.1:${RAY_PORT}" "${PYTHON}" "${SMOKE_DIR}/record_ray_state.py" "${OUT}/ray_state.json" \
        >"${OUT}/run_config/record_ray_state.log" 2>&1 ||
        ss_die "could not read the Ray cluster's state; the end of ${OUT}/run_config/record_ray_state.log:
$(tail -n 40 "${OUT}/run_config/record_ray_state.log")"
}

# After everything stopped (the proxy writes requests.jsonl as it stops): every file the tests read is there.
smoke_collect() {
    [ -s "${OUT}/requests.jsonl" ] || ss_die "the recording proxy wrote no ${OUT}/requests.jsonl; see ${OUT}/serve.log"
    "${PYTHON}" "${SMOKE_DIR}/export_wandb.py" "${WANDB_DIR}" "${OUT}/wandb_history.jsonl" ||
        ss_die "no offline wandb run to read under ${WANDB_DIR}; see ${OUT}/train.log"
    local id missing=()
    for ((id = 0; id < NUM_ROLLOUT; id++)); do
        [ -s "${OUT}/rollout_${id}.pt" ] || missing+=("rollout_${id}.pt")
    done
    [ -s "${OUT}/rollout_eval_0.pt" ] || missing+=("rollout_eval_0.pt")
    [ "${#missing[@]}" = 0 ] || ss_die "train.py exited 0 but did not save ${missing[*]} in ${OUT}; see ${OUT}/train.log"
    local var values=()
    if [ "${SMOKE_ROLLOUT}" = fully_async ]; then
        local aborts
        aborts="$(wc -l <"${OUT}/aborts.jsonl" 2>/dev/null || echo 0)"
        [ "${aborts}" -ge $((NUM_ROLLOUT - 1)) ] ||
            ss_die "the abort between steps ran ${aborts} times, not $((NUM_ROLLOUT - 1)); see ${OUT}/run_config/aborts.log"
    fi
    for var in SMOKE_CONFIG SMOKE_ROLLOUT SGLANG_SERVER_CONCURRENCY NUM_ROLLOUT ROLLOUT_BATCH_SIZE N_SAMPLES_PER_PROMPT OVER_SAMPLING_BATCH_SIZE PARTIAL_ROLLOUT \
        MASK_OFFPOLICY EVAL_INTERVAL EVAL_PROMPTS EVAL_N_SAMPLES MAX_RESPONSE_LEN EVAL_MAX_RESPONSE_LEN \
        PLUGIN_CONFIG SMOKE_SETTINGS HF_CHECKPOINT TRAIN_DATA EVAL_DATA TRAIN_SECONDS; do
        values+=("${var}=${!var}")
    done
    "${PYTHON}" -c 'import json, sys
values = dict(arg.split("=", 1) for arg in sys.argv[2:])
json.dump({k.lower(): int(v) if v.isdigit() else v for k, v in values.items()}, open(sys.argv[1], "w"), indent=2)' \
        "${OUT}/smoke.json" "${values[@]}"
}

smoke_main() {
    local started=${SECONDS}
    smoke_prepare_out "$1"
    WANDB_DIR="${OUT}/wandb"
    ss_defaults
    WANDB_KEY="" # the smoke logs offline, whatever key the environment holds
    trap smoke_cleanup EXIT
    trap ss_on_signal INT TERM
    smoke_build
    smoke_data
    smoke_configs
    smoke_start_server
    smoke_start_ray
    smoke_train
    smoke_record_ray
    ss_log "stopping the Ray head and the server"
    smoke_cleanup
    smoke_collect
    smoke_expected_lines "${OUT}"
    ss_log "done in $((SECONDS - started)) s (train.py ${TRAIN_SECONDS} s): ${OUT}"
}

smoke_main "$1"
