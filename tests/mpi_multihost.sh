#!/usr/bin/env bash
# Many machines, for real, on one: four network namespaces on a bridge, each a "host" with its own
# address and host name (tests/netns_hosts.sh), its link rate-limited with tc. mpirun starts its
# daemons there through an rsh agent and the ranks talk TCP over the test subnet (shared memory only
# between ranks of one host). Checks:
#  - at 1 Gbit/s, lenet trained across two hosts reports exactly what one host reports, each rank's
#    worker log shows its own host, and with --grad-compress bf16 it trains there too;
#  - at 1 Gbit/s, cohort bench allreduce --compress bf16 across two hosts checks every sum;
#  - at 10 Gbit/s, test_mpi --epoch-only (gradients and the parameters after an epoch equal one
#    process's, every rank the same bits) on 2 hosts, on 4 hosts x 1 rank, and on 2 hosts x 2 ranks.
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): without it, says so and exits 77 (ctest: skipped).
#   mpi_multihost.sh COHORT TEST_MPI DATA_ROOT MPIRUN...
set -uo pipefail
cohort=$1 test_mpi=$2 data=$3; shift 3
mpirun=("$@")
tmp=$(mktemp -d)
. "$(dirname "$0")/netns_hosts.sh"
cleanup() { netns_down; rm -rf "$tmp"; }
if ! netns_up 4 "$tmp"; then
    cleanup
    echo "SKIP: cannot create network namespaces here (needs root with CAP_NET_ADMIN)"
    exit 77
fi
trap cleanup EXIT

fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
# across HOSTS SLOTS: mpirun over the first HOSTS hosts with SLOTS ranks each.
across() {
    local hosts=$1 slots=$2 i
    for ((i = 1; i <= hosts; i++)); do printf '%s slots=%s\n' "$NETNS_NET.$i" "$slots"; done >"$tmp/hosts.$hosts.$slots"
    mapfile -t args < <(netns_mpirun_args "$tmp/hosts.$hosts.$slots")
    echo "${mpirun[@]}" -np $((hosts * slots)) "${args[@]}"
}

netns_rate 1gbit
check "links limited to 1 Gbit/s" $?
T=(train --model lenet --data "$data/mnist" --epochs 2 --train-limit 1100 --test-limit 1000 -b 64
   --lr 0.3 --momentum 0.9 --seed 3 --no-progress)
timeout 300 "$cohort" "${T[@]}" --threads 1 >"$tmp/one" 2>&1
check "one host trains (exit $?)" $?
timeout 300 $(across 2 1) "$cohort" "${T[@]}" --log-dir "$tmp/logs" >"$tmp/two" 2>&1
rc=$?
check "two hosts train at 1 Gbit/s (exit $rc)" $rc
cat "$tmp/one" "$tmp/two"
# The same losses and accuracies, up to the order of float sums (the parameters themselves are
# compared by test_mpi below): loss within 1e-3, accuracies within 2 samples in 1000.
figures() { sed -n 's/^epoch \([0-9]*\), loss \([0-9.]*\), train acc \([0-9.]*\), test acc \([0-9.]*\),.*/\1 \2 \3 \4/p' "$1"; }
paste <(figures "$tmp/one") <(figures "$tmp/two") | awk 'NF == 8 { n++; if ($1 != $5 || $2 - $6 > 1e-3 || $6 - $2 > 1e-3 ||
    $3 - $7 > 0.002 || $7 - $3 > 0.002 || $4 - $8 > 0.002 || $8 - $4 > 0.002) bad++ } END { exit !(n == 2 && !bad) }'
check "two hosts report what one host reports (loss within 1e-3, accuracies within 0.002)" $?
grep -q "host cohort-host1," "$tmp/logs/workerlog.0" && grep -q "host cohort-host2," "$tmp/logs/workerlog.1"
check "rank 0 ran on cohort-host1 and rank 1 on cohort-host2" $?
timeout 300 $(across 2 1) "$cohort" "${T[@]}" --grad-compress bf16 --metrics "$tmp/bf16.jsonl" >"$tmp/bf16" 2>&1
rc=$?
cat "$tmp/bf16"
[ "$rc" -eq 0 ] && [ "$(figures "$tmp/bf16" | wc -l)" -eq 2 ] && grep -q '"grad_compress": "bf16"' "$tmp/bf16.jsonl"
check "two hosts train with --grad-compress bf16 at 1 Gbit/s, recorded in the metrics (exit $rc)" $?
timeout 300 $(across 2 1) "$cohort" bench allreduce --compress bf16 --min-bytes 65536 --max-bytes 4194304 2>&1 | grep -v '^\['
check "bench allreduce --compress bf16 across two hosts at 1 Gbit/s (every sum checked)" "${PIPESTATUS[0]}"

# --trace with no folder shared between the hosts: host 2 sees its own empty $tmp/trace, so only
# MPI can bring rank 1's part to rank 0, whose host alone gets the one merged file.
mkdir -p "$tmp/trace"
NETNS_PRIVATE=$tmp/trace timeout 300 $(across 2 1) "$cohort" "${T[@]}" --epochs 1 --trace "$tmp/trace/t.json" --bucket-mb 0.1 \
    --trace-steps 4 >"$tmp/traced" 2>&1
rc=$?
[ "$rc" -eq 0 ] && python3 "$(dirname "$0")/trace_check.py" "$tmp/trace/t.json" 2 1 4 --no-overlap && grep -q '"rank 1 (cohort-host2)"' "$tmp/trace/t.json" &&
    [ "$(ls "$tmp/trace")" = t.json ]
check "--trace across two hosts with no shared folder: one merged trace on rank 0's host (exit $rc)" $?

netns_rate 10gbit
check "links limited to 10 Gbit/s" $?
for shape in "2 1" "4 1" "2 2"; do
    set -- $shape
    timeout 600 $(across "$1" "$2") "$test_mpi" --epoch-only "$data" 2>&1 | grep -v '^\['
    check "test_mpi across $1 hosts x $2 rank(s) at 10 Gbit/s" "${PIPESTATUS[0]}"
done
[ "$fails" -eq 0 ]
