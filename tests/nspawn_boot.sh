#!/usr/bin/env bash
# Boot systemd as PID 1 of a systemd-nspawn container whose root is an overlay of this machine's
# own / with a tmpfs upper layer: the container sees the installed system and writes nowhere.
#
# Usage: unshare --mount --propagation private -- nspawn_boot.sh NSPAWN WORKDIR CGROUP [NSPAWN-ARGS...]
#
# Run it in a private mount namespace (unshare): the overlay, its tmpfs and the tmpfs on /run (so
# nspawn's runtime files never reach the host's /run) die with that namespace. The script puts
# itself into a cgroup of its own, CGROUP, in each writable hierarchy (name=systemd on cgroup v1,
# and cgroup2), so everything nspawn and the container create there lies below it; on the way out
# (the container halted, or SIGTERM/SIGINT/SIGHUP received) it halts the container, waits for
# nspawn, moves itself back, removes that cgroup tree and then WORKDIR.
set -euo pipefail

[[ $# -ge 3 ]] || { echo "usage: $0 NSPAWN WORKDIR CGROUP [NSPAWN-ARGS...]" >&2; exit 2; }
nspawn=$1 work=$2 cgname=$3
shift 3
[[ $cgname =~ ^[A-Za-z0-9._-]+$ ]] || { echo "$0: bad cgroup name '$cgname'" >&2; exit 2; }

# ---- a cgroup of our own in each hierarchy nspawn writes to ------------------------------------
homes=()   # where this script was: restored before the cleanup
ours=()    # the cgroups it made
while read -r _ mnt fstype opts _; do
    key=""
    case $fstype in
        cgroup2) key="" ;;
        cgroup) [[ ,$opts, == *,name=systemd,* ]] || continue; key="name=systemd" ;;
        *) continue ;;
    esac
    # this process's path in that hierarchy: "0::/path" (cgroup2) or "N:name=systemd:/path"
    path=$(awk -F: -v k="$key" '$2 == k { sub(/^[^:]*:[^:]*:/, ""); print; exit }' /proc/self/cgroup)
    [[ -n $path ]] || continue
    home=$mnt${path%/}
    [[ -d $home ]] || continue
    homes+=("$home")
    ours+=("$home/$cgname")
done </proc/self/mounts

# shellcheck disable=SC2317  # the cleanup functions run from traps
cleanup_cgroups() {
    local i tries
    for i in "${!ours[@]}"; do
        echo $$ >"${homes[$i]}/cgroup.procs" 2>/dev/null || true
        for tries in $(seq 300); do   # processes of a dead container take a moment to go
            [[ -d ${ours[$i]} ]] || break
            find "${ours[$i]}" -depth -type d -exec rmdir {} + 2>/dev/null || true
            [[ -d ${ours[$i]} ]] || break
            [[ $tries -lt 300 ]] && sleep 0.1
        done
        [[ ! -d ${ours[$i]} ]] || echo "$0: could not remove cgroup ${ours[$i]}" >&2
    done
}
# shellcheck disable=SC2317
cleanup() {
    if [[ -n ${timer:-} ]]; then   # end the timer's sleep: the timer then exits without acting
        local sleeper
        sleeper=$(cat "/proc/$timer/task/$timer/children" 2>/dev/null || true)
        # shellcheck disable=SC2086  # pids, split on purpose
        kill ${sleeper:-$timer} 2>/dev/null || true
        wait "$timer" 2>/dev/null || true   # reaped here: no zombie outlives the script
    fi
    cleanup_cgroups
    umount -R "$work" 2>/dev/null || true
    umount /run 2>/dev/null || true
    rmdir "$work" 2>/dev/null || true
}
trap cleanup EXIT
for cg in "${ours[@]}"; do
    mkdir "$cg"
    echo $$ >"$cg/cgroup.procs"
done

# ---- the root: an overlay of /, writes into tmpfs; a private /run ------------------------------
mount -t tmpfs -o mode=0700 dflash-nspawn "$work"
mkdir "$work/upper" "$work/work" "$work/root"
mount -t overlay dflash-nspawn -o "lowerdir=/,upperdir=$work/upper,workdir=$work/work" "$work/root"
mount -t tmpfs -o mode=0755 dflash-nspawn-run /run

# ---- boot, and halt it when told ---------------------------------------------------------------
"$nspawn" --quiet --directory="$work/root" --boot --register=no --keep-unit --console=pipe \
    --link-journal=no "$@" </dev/null &
pid=$!
# A halt that does not finish in HALT_TIMEOUT seconds (systemd-shutdown waits up to 90 s for a
# process it signalled, e.g. one a killed test left entered into the container) becomes an
# immediate termination: nspawn's answer to a second SIGTERM.
HALT_TIMEOUT=${HALT_TIMEOUT:-15}
timer=""
# shellcheck disable=SC2317
halt() {
    [[ -z $timer ]] || return 0   # halting already
    kill -TERM "$pid" 2>/dev/null || true
    (sleep "$HALT_TIMEOUT" && kill -TERM "$pid" 2>/dev/null) &
    timer=$!
}
trap halt TERM INT HUP
status=0
while kill -0 "$pid" 2>/dev/null; do
    wait "$pid" && status=0 || status=$?
done
exit "$status"
