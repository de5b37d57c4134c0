#!/usr/bin/env bash
# Start a real two-node SLURM cluster on this machine (two slurmd daemons on localhost), for tests and CI.
#
#   scripts/ci/start_slurm.sh DIR      # prints SLURM_CONF=DIR/slurm.conf on success
#   scripts/ci/stop_slurm.sh DIR       # stops the daemons it started
#
# Installs slurmd, slurmctld, slurm-client and munge with apt-get when they are missing (needs root).
# Exit codes: 0 running; 77 this machine cannot do it (not root, no apt-get/dpkg, install failed), with the
# reason on stderr, so a test can skip and say why; 1 the daemons did not come up (a real failure).
# Ports: slurmctld on $SLURM_CTLD_PORT (default 16817), the nodes on $SLURM_NODE_PORT and +1 (default 17101),
# away from the defaults so that a system SLURM on the same machine is not disturbed.
set -uo pipefail
D="${1:?usage: start_slurm.sh DIR}"
mkdir -p "$D" && D="$(cd "$D" && pwd)"
CTLD_PORT="${SLURM_CTLD_PORT:-16817}"
NODE_PORT="${SLURM_NODE_PORT:-17101}"
cannot() { echo "start_slurm: cannot run SLURM here: $*" >&2; exit 77; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
    || ! command -v munged >/dev/null; then
    [ "$(id -u)" = 0 ] || cannot "slurmctld/slurmd/munge are not installed and installing needs root"
    command -v apt-get >/dev/null && command -v dpkg >/dev/null || cannot "no apt-get/dpkg to install slurm (Debian packages)"
    echo "start_slurm: installing slurmd slurmctld slurm-client munge" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmd slurmctld slurm-client munge) \
        >"$D/apt.log" 2>&1 || cannot "apt-get install failed (see $D/apt.log): $(tail -n 1 "$D/apt.log")"
fi
[ "$(id -u)" = 0 ] || cannot "slurmd must run as root to start jobs as the submitting user"

# munge authenticates every SLURM message; one munged per machine serves every cluster on it.
if ! (munge -n | unmunge) >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    [ -f /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || /usr/sbin/create-munge-key -f; chown munge:munge /etc/munge/munge.key; }
    runuser -u munge -- munged || { echo "start_slurm: munged did not start" >&2; exit 1; }
    sleep 1
    cp /run/munge/munged.pid "$D/munged.pid" 2>/dev/null # ours to stop; a munged that was already up is not
fi

mkdir -p "$D/state" "$D/spool/node1" "$D/spool/node2"
cat >"$D/slurm.conf" <<EOF
ClusterName=local
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.%n.pid
SlurmctldLogFile=$D/ctld.log
SlurmdLogFile=$D/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobRequeue=1
MinJobAge=600
NodeName=node[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$NODE_PORT-$((NODE_PORT + 1)) CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$D/slurm.conf"
slurmctld -f "$SLURM_CONF" || { echo "start_slurm: slurmctld failed; see $D/ctld.log" >&2; exit 1; }
slurmd -f "$SLURM_CONF" -N node1 || { echo "start_slurm: slurmd node1 failed" >&2; exit 1; }
slurmd -f "$SLURM_CONF" -N node2 || { echo "start_slurm: slurmd node2 failed" >&2; exit 1; }
for _ in $(seq 60); do
    if [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = 2 ]; then
        echo "SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 1
done
echo "start_slurm: the two nodes did not become idle within 60 s:" >&2
sinfo -N >&2 || true
tail -n 20 "$D/ctld.log" >&2
exit 1
