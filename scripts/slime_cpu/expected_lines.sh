# shellcheck shell=bash
# The lines of the CPU smoke's logs that read as failures but are expected, each with what it means. Sourced by
# scripts/slime_cpu_smoke.sh, whose summary counts them (a user opening train.log sees them named first); never
# executed. Standalone, so that a test can source it alone.
#
#     smoke_expected_lines OUT_DIR    # on stderr, one line per pattern found: how many, in which logs, what it
#                                     # means (nothing when none is found)

# Each entry: an extended regular expression (grep -E) matching one line per occurrence, a tab, the name said, a
# tab, what it means. (aiohttp writes its message on the line after "BadHttpMessage: 400, message:".)
SMOKE_EXPECTED_LINES=(
    'Pause on PRI/Upgrade'$'\t''aiohttp "BadHttpMessage: 400, message: Pause on PRI/Upgrade"'$'\t''a client opened a connection with HTTP/2'"'"'s preface (PRI * HTTP/2.0) to an aiohttp server, which speaks HTTP/1.1 only and refuses that connection; requests over HTTP/1.1 are not affected'
    'Failed to mark the local node as draining'$'\t''Ray "Failed to mark the local node as draining"'$'\t''the Ray head, stopped with SIGTERM at the end of the smoke, could not ask its GCS (stopping too) to drain the node first; it shuts down at once, as intended'
    'GenerationAbortedError.*event loop cycle failed|event loop cycle failed.*GenerationAbortedError'$'\t''Strands "exception=<GenerationAbortedError> | event loop cycle failed"'$'\t''slime aborted the generations still running once its batch was full (over-sampling); Strands logs every abort as a failed cycle, and the episode ends ABORTED, handed back to slime (partial rollout), not failed'
    'incorrect regex pattern'$'\t''transformers "incorrect regex pattern"'$'\t''transformers cannot tell from the tiny model'"'"'s config.json (no transformers_version) that its tokenizer is not a Mistral one; the warning is about Mistral-Small-3.1'"'"'s regex, not the Qwen3 tokenizer the smoke uses'
)
SMOKE_EXPECTED_LOGS=(train.log server.log serve.log ray.log)

smoke_expected_lines() { # out_dir
    local entry pattern name meaning log count total where found=()
    for entry in "${SMOKE_EXPECTED_LINES[@]}"; do
        IFS=$'\t' read -r pattern name meaning <<<"${entry}"
        total=0
        where=()
        for log in "${SMOKE_EXPECTED_LOGS[@]}"; do
            [ -f "$1/${log}" ] || continue
            count="$(grep -E -c -- "${pattern}" "$1/${log}" || true)"
            if [ "${count:-0}" -gt 0 ]; then
                total=$((total + count))
                where+=("${log}")
            fi
        done
        [ "${total}" = 0 ] || found+=("${total} x ${name} (${where[*]}): ${meaning}")
    done
    [ "${#found[@]}" -gt 0 ] || return 0
    printf '[slime-strands] lines in the logs that read as failures but are expected:\n' >&2
    printf '[slime-strands]   %s\n' "${found[@]}" >&2
}
