#!/usr/bin/env bash
# Stop what ci/slurm-up.sh STATE_DIR started: cancel the cluster's jobs, then stop slurmd, slurmctld and
# munged by the PIDs it wrote (checking each PID still runs that daemon), and remove the configuration
# files it wrote under /etc/slurm.  Safe to run twice, or after a failed bring-up.
set -uo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

state=${1:?usage: ci/slurm-down.sh STATE_DIR}
marker="# written by crop ci/slurm-up.sh"
[[ -d $state ]] || exit 0

alive() { # PID NAME: the process is alive and still is NAME (a PID can be reused)
    [[ -n $1 ]] && kill -0 "$1" 2>/dev/null && [[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]]
}

# jobs first, while slurmctld can still cancel them (their slurmstepd outlive slurmd otherwise)
if [[ -s $state/slurmctld.pid ]] && alive "$(cat "$state/slurmctld.pid")" slurmctld &&
    grep -qF "$marker; state in $(cd "$state" && pwd)" /etc/slurm/slurm.conf 2>/dev/null; then
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    if [[ -n ${jobs// } ]]; then
        # shellcheck disable=SC2086
        timeout 10 scancel --full $jobs >/dev/null 2>&1 || true
        for _ in $(seq 50); do
            [[ -z $(timeout 5 squeue -h -t running,completing 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
fi

for d in slurmd slurmctld munged; do
    f=$state/$d.pid
    [[ -s $f ]] || continue
    pid=$(cat "$f")
    if alive "$pid" "$d"; then
        kill -TERM "$pid"
        for _ in $(seq 100); do alive "$pid" "$d" || break; sleep 0.1; done
        if alive "$pid" "$d"; then kill -KILL "$pid"; echo "slurm-down: killed $d ($pid)" >&2; fi
    fi
    rm -f "$f"
done

# the configuration, if it is this cluster's (gres.conf goes with it)
if grep -qF "$marker; state in $(cd "$state" && pwd)" /etc/slurm/slurm.conf 2>/dev/null; then
    rm -f /etc/slurm/slurm.conf
    grep -qF "$marker" /etc/slurm/gres.conf 2>/dev/null && rm -f /etc/slurm/gres.conf
fi
echo "slurm-down: stopped (state and logs kept in $state)"
