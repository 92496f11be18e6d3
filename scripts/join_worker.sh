#!/usr/bin/env bash
# Join this node to a multi-node run as a Ray worker. Start the run on the head node first
# (NUM_NODES=2 MASTER_ADDR=<head ip> bash scripts/strands_qwen3_8b.sh); it waits for the workers and
# prints this command. Stays in the foreground; Ctrl-C (or the end of the run) leaves the cluster and
# stops the Ray worker this script started.
#
#   MASTER_ADDR=10.0.0.1 bash scripts/join_worker.sh
#   MASTER_ADDR=10.0.0.1 DRY_RUN=1 bash scripts/join_worker.sh
#
# Requirements on every node: the same image, slime_strands installed, and the checkpoints, data and
# SAVE_DIR on a filesystem mounted at the same paths as on the head node.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
ss_defaults
: "${NODE_IP:=}"

SS_PREFLIGHT_ERRORS=()
[ -n "${MASTER_ADDR}" ] || ss_fail "set MASTER_ADDR to the head node's IP address (printed by the head's training script)"
ss_check_ray
ss_check_gpus "${NUM_GPUS}"
ss_check_plugin
ss_preflight_finish worker

cmd=(ray start --address "${MASTER_ADDR:-<head-ip>}:${RAY_PORT}" --num-gpus "${NUM_GPUS}" --disable-usage-stats --block)
[ -n "${NODE_IP}" ] && cmd+=(--node-ip-address "${NODE_IP}")
if ss_is_dry_run; then
    ss_print_cmd "${cmd[@]}"
    exit 0
fi
# This script started the worker, so it (and only it) stops it.
trap 'ray stop >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM
ss_run "${cmd[@]}"
