# shellcheck shell=bash
# A progress line for a long, quiet phase of a script (a venv's build, a server's start, train.py). Sourced, never
# executed; standalone (it needs nothing of common.sh), so that a test can source it alone.
#
#     ss_tick_start "building the driver venv"   # a line on stderr every SS_TICK_S (30) seconds:
#     ...                                        #   [slime-strands] ... building the driver venv: 1m30s so far
#     ss_tick_stop                               # the ticker and its sleep are gone when this returns
#
# One ticker at a time (a new start stops the one before). The ticker is a background subshell of this shell;
# ss_tick_stop ends it and waits for it, and its sleep ends with it (its TERM trap kills the sleep it waits on),
# so no process is left behind. A script calls ss_tick_stop in its EXIT trap too (an error in the phase exits the
# script without reaching the ss_tick_stop after it), and never waits with a bare `wait` (that would wait for the
# ticker). Should the script be killed outright, the ticker sees at its next line that the script is gone, and
# ends.

SS_TICK_PID=""

# 90 -> 1m30s, 42 -> 42s
ss_tick_elapsed() {
    if [ "$1" -ge 60 ]; then
        printf '%dm%02ds' "$(($1 / 60))" "$(($1 % 60))"
    else
        printf '%ds' "$1"
    fi
}

# Starts the ticker for phase $1; $2 (optional): a command whose one-line output is added to each line (what the
# phase is at, e.g. the rollouts saved so far).
ss_tick_start() { # phase [status_command]
    ss_tick_stop
    local phase="$1" status="${2:-}" interval="${SS_TICK_S:-30}" started=${SECONDS} parent=$$
    (
        sleeper=""
        # shellcheck disable=SC2317 # run by the TERM trap below
        ss_tick_end() {
            local pids # the sleep, even one started an instant before its pid was kept
            read -r -a pids <<<"${sleeper} $(jobs -p | tr '\n' ' ')"
            [ "${#pids[@]}" = 0 ] || kill "${pids[@]}" 2>/dev/null || true
            exit 0
        }
        trap ss_tick_end TERM
        while :; do
            sleep "${interval}" &
            sleeper=$!
            wait "${sleeper}" || true
            sleeper=""
            kill -0 "${parent}" 2>/dev/null || exit 0
            line="${phase}: $(ss_tick_elapsed $((SECONDS - started))) so far"
            if [ -n "${status}" ]; then
                line="${line} ($({ ${status} || true; } 2>/dev/null | head -n 1))"
            fi
            printf '[slime-strands] ... %s\n' "${line}" >&2
        done
    ) </dev/null &
    SS_TICK_PID=$!
}

ss_tick_stop() {
    [ -n "${SS_TICK_PID}" ] || return 0
    kill -TERM "${SS_TICK_PID}" 2>/dev/null || true
    wait "${SS_TICK_PID}" 2>/dev/null || true
    SS_TICK_PID=""
}
