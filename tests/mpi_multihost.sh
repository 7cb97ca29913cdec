#!/usr/bin/env bash
# Many machines, for real, on one: two network namespaces joined by veth pairs and a bridge, each a
# "host" with its own address (10.77.N.1 and .2) and, in its own UTS namespace, its own host name.
# mpirun starts its daemons there through plm_rsh_agent (a script that enters the namespace where
# ssh would log in) and the ranks talk TCP over the test subnet only (btl tcp,self). Checks:
#  - lenet trained across the two hosts reports exactly what one host reports, and each rank's
#    worker log shows its own host;
#  - test_mpi across the two hosts: gradients and the parameters after an epoch match one process.
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): without it, says so and exits 77 (ctest: skipped).
#   mpi_multihost.sh COHORT TEST_MPI DATA_ROOT MPIRUN...
set -uo pipefail
cohort=$1 test_mpi=$2 data=$3; shift 3
mpirun=("$@")
id=$$ net=10.77.$(( $$ % 200 + 20 ))
ns1=cohort_h1_$id ns2=cohort_h2_$id br=chbr$id
tmp=$(mktemp -d)

cleanup() {
    ip netns del "$ns1" 2>/dev/null; ip netns del "$ns2" 2>/dev/null
    ip link del "$br" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

if ! ip netns add "$ns1" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces here (needs root with CAP_NET_ADMIN)"
    exit 77
fi
set -e
ip netns add "$ns2"
ip link add "$br" type bridge
ip addr add "$net.254/24" dev "$br"
ip link set "$br" up
i=0
for ns in "$ns1" "$ns2"; do
    i=$((i + 1))
    ip link add "chv${i}_$id" type veth peer name eth0 netns "$ns"
    ip link set "chv${i}_$id" master "$br" up
    ip netns exec "$ns" ip addr add "$net.$i/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
done

# The rsh agent: "agent HOST COMMAND..." runs COMMAND on HOST as ssh would (through a shell).
cat >"$tmp/netns-rsh" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in
  $net.1) ns=$ns1 name=cohort-host1 ;;
  $net.2) ns=$ns2 name=cohort-host2 ;;
  *) echo "netns-rsh: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec \$ns unshare --uts sh -c "hostname \$name && \$*"
AGENT
chmod +x "$tmp/netns-rsh"
printf '%s slots=1\n%s slots=1\n' "$net.1" "$net.2" >"$tmp/hosts"
set +e

across=("${mpirun[@]}" -np 2 --hostfile "$tmp/hosts" --mca plm_rsh_agent "$tmp/netns-rsh"
        --mca btl tcp,self --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24")
fails=0
check() { if [ "$2" -eq 0 ]; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }

T=(train --model lenet --data "$data/mnist" --epochs 2 --train-limit 1100 --test-limit 1000 -b 64
   --lr 0.3 --momentum 0.9 --seed 3 --no-progress)
timeout 300 "$cohort" "${T[@]}" --threads 1 >"$tmp/one" 2>&1
check "one host trains (exit $?)" $?
timeout 300 "${across[@]}" "$cohort" "${T[@]}" --log-dir "$tmp/logs" >"$tmp/two" 2>&1
rc=$?
check "two hosts train (exit $rc)" $rc
cat "$tmp/one" "$tmp/two"
# The same losses and accuracies, up to the order of float sums (the parameters themselves are
# compared by test_mpi below): loss within 1e-3, accuracies within 2 samples in 1000.
figures() { sed -n 's/^epoch \([0-9]*\), loss \([0-9.]*\), train acc \([0-9.]*\), test acc \([0-9.]*\),.*/\1 \2 \3 \4/p' "$1"; }
paste <(figures "$tmp/one") <(figures "$tmp/two") | awk 'NF == 8 { n++; if ($1 != $5 || $2 - $6 > 1e-3 || $6 - $2 > 1e-3 ||
    $3 - $7 > 0.002 || $7 - $3 > 0.002 || $4 - $8 > 0.002 || $8 - $4 > 0.002) bad++ } END { exit !(n == 2 && !bad) }'
check "two hosts report what one host reports (loss within 1e-3, accuracies within 0.002)" $?
grep -q "host cohort-host1," "$tmp/logs/workerlog.0" && grep -q "host cohort-host2," "$tmp/logs/workerlog.1"
check "rank 0 ran on cohort-host1 and rank 1 on cohort-host2" $?

timeout 600 "${across[@]}" "$test_mpi" --epoch-only "$data" 2>&1 | grep -v '^\[' 
check "test_mpi across two hosts" "${PIPESTATUS[0]}"
[ "$fails" -eq 0 ]
