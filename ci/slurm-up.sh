#!/usr/bin/env bash
# Bring up a real one-node SLURM cluster on this machine, for CI (tests/test_hpc.py) or by hand:
#   ci/slurm-up.sh STATE_DIR      ...      ci/slurm-down.sh STATE_DIR
# Needs root and the Debian packages slurm-wlm and munge (no systemd: the daemons are started directly,
# in the foreground of their own sessions, and their PIDs written to STATE_DIR/*.pid for slurm-down.sh).
# munged, slurmctld and slurmd listen on 127.0.0.1 only.  The node declares one fake GPU
# (gres.conf: File=/dev/null) so that jobs asking for --gpus=1 are scheduled and accounted like real ones.
# No slurmdbd (as on some sites): profiles/slurm asks job states of `squeue`, which sees a finished job only
# for MinJobAge seconds (>= 180, the plugin's longest gap between two checks, or it waits forever); set
# here to 7200, so that the tests can still read every job of a long run (the paper rehearsal's) from the
# controller when it ends.  `sacct` would answer "accounting storage is disabled" and the run would hang.
# slurm.conf must live at /etc/slurm/slurm.conf: the plugin's job step drops SLURM_CONF.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

state=${1:?usage: ci/slurm-up.sh STATE_DIR}
conf_dir=/etc/slurm
marker="# written by crop ci/slurm-up.sh"
node=crop-ci
ctld_port=${CROP_SLURMCTLD_PORT:-16817}
slurmd_port=${CROP_SLURMD_PORT:-16818}

die() { echo "slurm-up: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "needs root (slurmd runs jobs as their users)"
for b in munged mungekey munge slurmctld slurmd sbatch squeue sinfo scontrol; do
    command -v "$b" >/dev/null || die "'$b' not found: apt-get install slurm-wlm munge"
done
for f in "$conf_dir/slurm.conf" "$conf_dir/gres.conf"; do
    if [[ -e $f ]] && ! grep -qF "$marker" "$f"; then
        die "$f exists and was not written by this script: not touching a real cluster's configuration"
    fi
done

mkdir -p "$state"
state=$(cd "$state" && pwd)
# a configuration this script wrote for another state folder whose daemons still run: one cluster at a time
other=$(sed -n "s|^$marker; state in ||p" "$conf_dir/slurm.conf" 2>/dev/null || true)
if [[ -n $other && $other != "$state" ]]; then
    for d in slurmd slurmctld munged; do
        if [[ -s $other/$d.pid ]] && kill -0 "$(cat "$other/$d.pid")" 2>/dev/null; then
            die "another cluster from this script is up (state $other): run ci/slurm-down.sh $other first"
        fi
    done
fi
for d in slurmd slurmctld munged; do
    if [[ -s $state/$d.pid ]] && kill -0 "$(cat "$state/$d.pid")" 2>/dev/null; then
        die "$d is already running (pid $(cat "$state/$d.pid")): run ci/slurm-down.sh $state first"
    fi
done
mkdir -p "$state/munge" "$state/ctld" "$state/spool" "$state/log"
chmod 755 "$state/munge"  # munged: the socket's folder must be searchable by all

# --- munge: own key and socket, so a site's munged (if any) is neither used nor disturbed
[[ -s $state/munge/munge.key ]] || mungekey --create --keyfile="$state/munge/munge.key" >/dev/null
chmod 600 "$state/munge/munge.key"
socket=$state/munge/munge.socket
setsid munged --foreground --force --socket="$socket" --key-file="$state/munge/munge.key" \
    --pid-file="$state/munge/munged.pidfile" --log-file="$state/log/munged.log" \
    --seed-file="$state/munge/munged.seed" </dev/null >>"$state/log/munged.out" 2>&1 &
echo $! >"$state/munged.pid"
for _ in $(seq 100); do
    munge -n -S "$socket" 2>/dev/null | unmunge -S "$socket" >/dev/null 2>&1 && break
    sleep 0.1
done
munge -n -S "$socket" | unmunge -S "$socket" >/dev/null || die "munged did not come up: $state/log/munged.log"

# --- configuration: this machine's CPUs and memory (less a margin), one fake GPU
read -r cpus boards sockets cores threads mem < <(slurmd -C | head -1 |
    sed -E 's/.*CPUs=([0-9]+) Boards=([0-9]+) SocketsPerBoard=([0-9]+) CoresPerSocket=([0-9]+) ThreadsPerCore=([0-9]+) RealMemory=([0-9]+).*/\1 \2 \3 \4 \5 \6/')
[[ $mem =~ ^[0-9]+$ ]] || die "could not read this machine's resources from 'slurmd -C'"
mem=$((mem * 9 / 10))
mkdir -p "$conf_dir"
cat >"$conf_dir/slurm.conf" <<CONF
$marker; state in $state
ClusterName=crop-ci
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pidfile
SlurmdPidFile=$state/slurmd.pidfile
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
MinJobAge=7200
InactiveLimit=0
KillWait=10
Waittime=0
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
cat >"$conf_dir/gres.conf" <<CONF
$marker
NodeName=$node Name=gpu File=/dev/null
CONF

# --- the daemons, each in the foreground of its own session
setsid slurmctld -D -i </dev/null >>"$state/log/slurmctld.out" 2>&1 &
echo $! >"$state/slurmctld.pid"
setsid slurmd -D -N "$node" </dev/null >>"$state/log/slurmd.out" 2>&1 &
echo $! >"$state/slurmd.pid"

fail() {
    echo "slurm-up: $*; logs in $state/log:" >&2
    tail -n 5 "$state"/log/*.out >&2 || true
    exit 1
}
st=
for _ in $(seq 150); do
    for d in munged slurmctld slurmd; do
        kill -0 "$(cat "$state/$d.pid")" 2>/dev/null || fail "$d exited"
    done
    st=$(timeout 5 sinfo -h -N -n "$node" -o %t 2>/dev/null || true)
    [[ $st == idle ]] && break
    sleep 0.2
done
[[ $st == idle ]] || fail "node state '${st:-?}' after 30 s"
echo "slurm-up: one-node cluster up (node $node: $cpus CPUs, $mem MB, gres gpu:1), state in $state"
