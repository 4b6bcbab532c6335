# shellcheck shell=bash
# Sourced by scripts/test, scripts/perf-deps and scripts/demo: apt-get that waits, bounded, while another apt or
# dpkg (unattended-upgrades, a second install on the same machine) holds its lock, instead of failing at once.
#
#   APT_SUDO=(sudo -n)      # or () as root
#   apt_get update -qq
#   apt_get install -y -qq PACKAGE...
#
# Why a loop and not only apt-get's -o DPkg::Lock::Timeout: that option covers dpkg's lock, not the lists lock
# `apt-get update` takes (nor the archives lock), and apt reports its own waiting on a progress display -qq hides.
# So a refusal that names a lock is logged once and retried every APT_LOCK_POLL seconds (default 5) until
# SHMBUS_APT_LOCK_WAIT seconds (default 300) have passed; any other failure is returned at once. apt-get's stdout
# is discarded (-qq prints nothing worth keeping there), its stderr shown. The caller defines log().

APT_SUDO=()

apt_get() {
    local wait="${SHMBUS_APT_LOCK_WAIT:-300}" poll="${APT_LOCK_POLL:-5}" deadline err rc said=0
    deadline=$((SECONDS + wait))
    err="$(mktemp -t shmbus-apt-XXXXXX)"
    while :; do
        rc=0
        "${APT_SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "$@" 2>"$err" >/dev/null || rc=$?
        if ((rc == 0)); then
            rm -f "$err"
            return 0
        fi
        if grep -qiE 'could not (get|open) lock|unable to (acquire|lock)' "$err"; then
            if ((SECONDS < deadline)); then
                if ((!said)); then
                    log "apt-get $1: another apt/dpkg holds a lock: waiting for it (at most ${wait}s):" \
                        "$(grep -m1 -iE 'lock' "$err" | cut -c1-160)"
                    said=1
                fi
                sleep "$poll"
                continue
            fi
            log "apt-get $1: the lock was still held after ${wait}s: giving up"
        fi
        cat "$err" >&2
        rm -f "$err"
        return "$rc"
    done
}
