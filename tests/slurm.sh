#!/usr/bin/env bash
# Slurm, for real: a controller and two slurmd "nodes" (network namespaces, tests/slurm_cluster.sh),
# and the job scripts users copy from examples/slurm/, submitted with sbatch.
#  1. train.sbatch: 2 tasks (one per node, srun --mpi=pmix) train lenet to the end; the epoch lines
#     are one process's (2 devices, the same split and sums); workerlog.0 and .1 are in the job's
#     folder, rank 1's naming the second node.
#  2. requeue.sbatch: rank 1's process is killed with SIGKILL mid-epoch; the job is requeued, the
#     second run resumes from the last step checkpoint (--resume auto), and its final checkpoint is
#     bit for bit the uninterrupted run's.
# Exit 77 (ctest: skipped) without the privilege to make namespaces, or without Slurm installed
# unless COHORT_REQUIRE_SLURM=1 (CI installs it, so there a missing Slurm is a failure).
#   slurm.sh COHORT DATA_ROOT EXAMPLES_DIR
set -uo pipefail
cohort=$1 data=$2 examples=$(cd "$3" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netns_hosts.sh
source "$here/netns_hosts.sh"
# shellcheck source=tests/slurm_cluster.sh
source "$here/slurm_cluster.sh"
tmp=$(mktemp -d)
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

if ! command -v sbatch >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    [ "${COHORT_REQUIRE_SLURM:-0}" = 1 ] && { echo "slurm: Slurm or munge is not installed"; exit 1; }
    echo "slurm: skipped: Slurm (slurmctld, slurmd, slurm-client) and munge are not installed"; exit 77
fi
slurm_up 2 "$tmp/cluster"; rc=$?
trap 'slurm_down; rm -rf "$tmp"' EXIT
if [ "$rc" -ne 0 ]; then
    if [ ! -d "$tmp/cluster" ] || ! ip netns list >/dev/null 2>&1; then echo "slurm: skipped: no privilege for namespaces"; exit 77; fi
    echo "slurm: the cluster did not come up"; tail -20 "$tmp"/cluster/log/*.log; exit 1
fi
# Between the namespace hosts ranks talk TCP over the test subnet (sbatch passes the environment on).
export OMPI_MCA_btl=tcp,vader,self OMPI_MCA_btl_tcp_if_include=$NETNS_NET.0/24 OMPI_MCA_oob_tcp_if_include=$NETNS_NET.0/24
export COHORT=$cohort DATA=$data/mnist

# The numbers of an epoch line (not its time or speed).
numbers() { sed -n 's/^\(epoch [0-9]*, loss [0-9.]*, train acc [0-9.]*, test acc [0-9.]*\),.*/\1/p' "$1"; }

# 1. A 2-task job to the end.
mkdir -p "$tmp/job1"
export ARGS="--model lenet --epochs 2 -b 64 --train-limit 2000 --test-limit 500 --threads 1"
( cd "$tmp/job1" && timeout 300 sbatch --wait --quiet "$examples/train.sbatch" ) || bad "train.sbatch: exit $?"
out=$(ls "$tmp"/job1/cohort-train-*.out 2>/dev/null | head -1)
# shellcheck disable=SC2086
"$cohort" train --data "$DATA" $ARGS --devices cpu*2 --threads 2 --no-progress >"$tmp/one.out" 2>&1
if [ -n "$out" ] && [ "$(numbers "$out" | wc -l)" -eq 2 ] && [ "$(numbers "$out")" = "$(numbers "$tmp/one.out")" ]; then ok
else bad "the job's epoch lines are not one process's:"; cat "$out" "$tmp/one.out"; fi
logs=$(ls -d "$tmp"/job1/logs-* 2>/dev/null | head -1)
if [ -f "$logs/workerlog.0" ] && grep -q "rank 1 of 2, .*host cohort-host2" "$logs/workerlog.1" 2>/dev/null &&
    [ "$(numbers "$logs/workerlog.1")" = "$(numbers "$tmp/one.out")" ]; then ok
else bad "workerlog.0/.1 missing or wrong in ${logs:-the job folder}"; ls -R "$tmp/job1"; fi

# 2. Killed mid-epoch, requeued, resumed: the same bits as without the kill.
mkdir -p "$tmp/job2"
export ARGS="--model lenet --epochs 2 -b 64 --train-limit 6000 --test-limit 500 --threads 1 --no-progress"
export EVERY=10 CKPT=$tmp/job2/ckpt COHORT_INJECT_FAULT=slow:0:300   # ~3 s per epoch: time to kill
job=$(cd "$tmp/job2" && sbatch --parsable "$examples/requeue.sbatch")
for ((i = 0; i < 600; i++)); do   # until a step checkpoint of the first epoch exists
    readlink "$CKPT/latest" 2>/dev/null | grep -q "^step-" && break
    sleep 0.1
done
pid=$(sed -n 's/.*host cohort-host2, pid \([0-9]*\),.*/\1/p' "$tmp/job2/logs-$job/workerlog.1" 2>/dev/null)
before=$(readlink "$CKPT/latest" 2>/dev/null)
if [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; then ok; else bad "no rank 1 process to kill (pid '$pid')"; fi
state=""
for ((i = 0; i < 600; i++)); do   # until the job has run again and completed (60 s at most)
    state=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    restarts=$(scontrol show job "$job" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
    [ "$state" = COMPLETED ] && break
    # Slurm holds a requeued job for about two minutes before it may start again; the test does
    # not wait for that (a user's job would), it moves the job's begin time to now.
    # The killed run's step daemons must be gone first (that is what the hold is for): a new step of
    # the same job and step id would find their PMIx socket still bound.
    if [ "$state" = PENDING ] && [ "${restarts:-0}" -ge 1 ] && [ -z "${hurried:-}" ] &&
        ! pgrep -f "slurmstepd: \[$job\." >/dev/null; then
        hurried=1
        scontrol update JobId="$job" StartTime=now >"$tmp/upd" 2>&1 || { bad "scontrol update StartTime:"; cat "$tmp/upd"; }
    fi
    case $state in FAILED|CANCELLED|TIMEOUT|NODE_FAIL) break ;; esac
    sleep 0.1
done
log=$tmp/job2/cohort-requeue-$job.out
if [ "$state" = COMPLETED ] && [ "${restarts:-0}" -ge 1 ] && grep -q "run 2 of job $job" "$log" &&
    grep -q "resuming from $CKPT" "$log"; then ok
else
    bad "killed at $before: job $job ended $state after ${restarts:-?} restarts"; cat "$log"; pgrep -af slurmstepd
    grep -h error "$tmp"/cluster/log/slurm*.log | tail -8
fi
env -u COHORT_INJECT_FAULT "$cohort" train --data "$DATA" $ARGS --devices cpu*2 --threads 2 --checkpoint-dir "$tmp/whole" >/dev/null 2>&1
for f in model.safetensors optimizer.safetensors; do
    if cmp -s "$CKPT/epoch-0002/$f" "$tmp/whole/epoch-0002/$f"; then ok
    else bad "the requeued run's $f differs from the uninterrupted run's (killed at $before)"; fi
done

echo "slurm: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
