# Sourced (bash): a real Slurm 22.05 cluster on one machine, for the tests. A controller (slurmctld)
# in this namespace and one slurmd per network-namespace host of netns_hosts.sh (cohort-host1..N,
# each with its own address, host name, and a private bind mount for the per-node temporary files,
# since PMIx names its directories by job and step only). munged with its own key and socket; no
# cgroups needed beyond the v1 hierarchies the machine has. Everything lives under DIR and ends
# with slurm_down (set as the EXIT trap).
#   slurm_up N DIR   start it (returns 2 when Slurm or munge are not installed, 1 on failure)
#   slurm_down       stop the daemons and remove the hosts
# After slurm_up, SLURM_CONF is exported and sbatch, squeue, scontrol work.
SLURM_DIR=

slurm_down() {
    [ -n "$SLURM_DIR" ] || return 0
    local f i
    # Everything still running on a node (slurmd, step daemons, tasks) lives in its namespace.
    for ((i = 1; i <= NETNS_COUNT; i++)); do
        ip netns pids "cohort_h${i}_$NETNS_ID" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    for f in "$SLURM_DIR"/slurmd.*.pid "$SLURM_DIR/slurmctld.pid" "$SLURM_DIR/munged.pid"; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
    done
    sleep 1
    for f in "$SLURM_DIR"/slurmd.*.pid "$SLURM_DIR/slurmctld.pid" "$SLURM_DIR/munged.pid"; do
        [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
    done
    netns_down
    SLURM_DIR=
}

# slurm_wait_idle N: until N nodes are idle (30 s at most).
slurm_wait_idle() {
    local i
    for ((i = 0; i < 60; i++)); do
        [ "$(sinfo -h -t idle -o '%D' 2>/dev/null | head -1)" = "$1" ] && return 0
        sleep 0.5
    done
    sinfo >&2
    return 1
}

slurm_up() {
    local n=$1 i
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null || return 2
    SLURM_DIR=$2
    mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/log" "$SLURM_DIR/tmp/node" || return 1
    netns_up "$n" "$SLURM_DIR" || return 1
    trap slurm_down EXIT
    mungekey -c -f -k "$SLURM_DIR/munge.key" >/dev/null 2>&1 || return 1
    chmod 600 "$SLURM_DIR/munge.key"
    munged --force -S "$SLURM_DIR/munge.sock" --key-file "$SLURM_DIR/munge.key" --pid-file "$SLURM_DIR/munged.pid" \
        --log-file "$SLURM_DIR/log/munged.log" --seed-file "$SLURM_DIR/munge.seed" || return 1
    local cpus
    cpus=$(nproc)
    {
        echo "ClusterName=cohorttest"
        echo "SlurmctldHost=$(hostname -s)($NETNS_NET.254)"
        echo "SlurmUser=root"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$SLURM_DIR/munge.sock"
        echo "CredType=cred/munge"
        echo "SlurmctldPort=$((17000 + NETNS_ID % 20000))"
        echo "SlurmdPort=6818"
        echo "StateSaveLocation=$SLURM_DIR/state"
        echo "SlurmdSpoolDir=$SLURM_DIR/spool/%n"
        echo "SlurmctldPidFile=$SLURM_DIR/slurmctld.pid"
        echo "SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid"
        echo "SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log"
        echo "SlurmdLogFile=$SLURM_DIR/log/slurmd.%n.log"
        echo "TmpFS=$SLURM_DIR/tmp/node"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "ReturnToService=2"
        echo "JobRequeue=1"
        echo "MailProg=/bin/true"
        echo "MpiDefault=none"
        for ((i = 1; i <= n; i++)); do
            echo "NodeName=cohort-host$i NodeAddr=$NETNS_NET.$i CPUs=$cpus RealMemory=1000 State=UNKNOWN"
        done
        echo "PartitionName=cohort Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$SLURM_DIR/slurm.conf"
    printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n' >"$SLURM_DIR/cgroup.conf"
    export SLURM_CONF=$SLURM_DIR/slurm.conf
    slurmctld -f "$SLURM_CONF" -i || return 1
    for ((i = 1; i <= n; i++)); do
        mkdir -p "$SLURM_DIR/spool/cohort-host$i" "$SLURM_DIR/tmp/cohort-host$i"
        ip netns exec "cohort_h${i}_$NETNS_ID" unshare --uts --mount --propagation private sh -c \
            "hostname cohort-host$i && mount --bind '$SLURM_DIR/tmp/cohort-host$i' '$SLURM_DIR/tmp/node' &&
             exec slurmd -f '$SLURM_CONF' -N cohort-host$i" || return 1
    done
    slurm_wait_idle "$n"
}
