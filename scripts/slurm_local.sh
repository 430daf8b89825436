#!/usr/bin/env bash
# slurm_local.sh - a one-node Slurm on this machine, for tests/cli_srun.sh
# (`srun --mpi=pmix tide train`: docs/training.md section 12).
#
#     scripts/slurm_local.sh [DIR]      # as root; DIR default /tmp/tide-slurm
#
# Installs Debian's slurmctld, slurmd, slurm-client and munge where missing,
# writes DIR/slurm.conf (this host, its cores, one partition that may be
# oversubscribed, PMIx as the MPI default), starts munged, slurmctld and
# slurmd unless they run, and waits until the node is idle. Then run srun
# with SLURM_CONF=DIR/slurm.conf (the script prints the line). Nothing is
# written outside DIR, /run/munge and the package manager's files.
set -euo pipefail
DIR=${1:-/tmp/tide-slurm}
if [ "$(id -u)" != 0 ]; then
    echo "slurm_local.sh: the daemons run as root here: run it as root" >&2
    exit 1
fi
need=()
for p in slurmctld slurmd slurm-client munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
host=$(hostname -s)
mkdir -p "$DIR/ctld" "$DIR/d" /run/munge
chown munge:munge /run/munge 2>/dev/null || true
cat >"$DIR/slurm.conf" <<EOF
ClusterName=tide-local
SlurmctldHost=$host
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ReturnToService=2
MpiDefault=pmix
JobAcctGatherType=jobacct_gather/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF=$DIR/slurm.conf
pgrep -x munged >/dev/null || /usr/sbin/munged --force </dev/null >/dev/null 2>&1
# this configuration's daemons, unless they answer already
if ! timeout 10 scontrol ping 2>/dev/null | grep -q "is UP"; then
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    for _ in $(seq 50); do pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break; sleep 0.2; done
    slurmctld -f "$SLURM_CONF" </dev/null >/dev/null 2>&1
    slurmd -f "$SLURM_CONF" </dev/null >/dev/null 2>&1
fi
end=$((SECONDS + 60))
while [ $SECONDS -lt $end ]; do
    timeout 5 sinfo -h -o %t 2>/dev/null | grep -q idle && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
    sleep 1
done
echo "slurm_local.sh: the node did not come up within 60 s (logs in $DIR)" >&2
exit 1
