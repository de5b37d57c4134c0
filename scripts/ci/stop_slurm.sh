#!/usr/bin/env bash
# Stop the daemons scripts/ci/start_slurm.sh DIR started, by the pids in their pid files (munged only if it started it).
# Jobs still running are cancelled first, so that no job step outlives its slurmd.
set -u
D="${1:?usage: stop_slurm.sh DIR}"
export SLURM_CONF="$D/slurm.conf"
if [ -f "$D/slurmctld.pid" ] && kill -0 "$(cat "$D/slurmctld.pid")" 2>/dev/null; then
    jobs="$(squeue -h -o %i 2>/dev/null)"
    if [ -n "$jobs" ]; then
        scancel $jobs 2>/dev/null
        for _ in $(seq 60); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
    fi
fi
for f in "$D"/slurmd.node1.pid "$D"/slurmd.node2.pid "$D"/slurmctld.pid "$D"/munged.pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
done
