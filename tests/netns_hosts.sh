# Sourced (bash): machines, for real, on one. Each "host" is a network namespace joined to a bridge
# by a veth pair, with its own address ($NETNS_NET.I) and, in its own UTS namespace, its own host
# name (cohort-hostI). mpirun reaches them through plm_rsh_agent: a script that enters the namespace
# where ssh would log in. Links can be rate-limited with tc (netns_rate) so that the gradient
# exchange, not the arithmetic, is the bottleneck, as on commodity Ethernet.
#   netns_up N DIR      make hosts 1..N (needs CAP_NET_ADMIN and CAP_SYS_ADMIN: returns 1 without);
#                       DIR receives the rsh agent
#   netns_hostfile F S  write a hostfile of every host with S slots
#   netns_mpirun_args F prints mpirun's arguments for hostfile F, one per line: TCP over the test
#                       subnet between hosts, shared memory inside one
#   netns_rate RATE     every host's link sends at most RATE (tc tbf: "1gbit", "10gbit"); "off" clears
#   NETNS_PRIVATE=DIR   (in mpirun's environment) hosts 2..N each see a private, empty DIR
#   netns_down          remove everything (also set as the EXIT trap by netns_up)
NETNS_ID=$$
NETNS_NET=10.77.$(( $$ % 200 + 20 ))
NETNS_COUNT=0
NETNS_DIR=

netns_down() {
    local i
    for ((i = 1; i <= NETNS_COUNT; i++)); do ip netns del "cohort_h${i}_$NETNS_ID" 2>/dev/null; done
    ip link del "chbr$NETNS_ID" 2>/dev/null
    NETNS_COUNT=0
}

netns_up() {
    local n=$1 i ns
    NETNS_DIR=$2
    if ! ip netns add "cohort_h1_$NETNS_ID" 2>/dev/null; then return 1; fi
    NETNS_COUNT=$n
    trap netns_down EXIT
    ip link add "chbr$NETNS_ID" type bridge || return 1
    ip addr add "$NETNS_NET.254/24" dev "chbr$NETNS_ID" || return 1
    ip link set "chbr$NETNS_ID" up || return 1
    for ((i = 1; i <= n; i++)); do
        ns=cohort_h${i}_$NETNS_ID
        [ "$i" -eq 1 ] || ip netns add "$ns" || return 1
        ip link add "chv${i}_$NETNS_ID" type veth peer name eth0 netns "$ns" || return 1
        ip link set "chv${i}_$NETNS_ID" master "chbr$NETNS_ID" up || return 1
        ip netns exec "$ns" ip addr add "$NETNS_NET.$i/24" dev eth0 || return 1
        ip netns exec "$ns" ip link set eth0 up || return 1
        ip netns exec "$ns" ip link set lo up || return 1
    done
    # The rsh agent: "agent HOST COMMAND..." runs COMMAND on HOST as ssh would (through a shell).
    cat >"$NETNS_DIR/netns-rsh" <<AGENT
#!/bin/sh
host=\$1; shift
i=\${host##*.}
case \$host in
  $NETNS_NET.[0-9]*) [ "\$i" -ge 1 ] && [ "\$i" -le $n ] || { echo "netns-rsh: unknown host \$host" >&2; exit 255; } ;;
  *) echo "netns-rsh: unknown host \$host" >&2; exit 255 ;;
esac
# With NETNS_PRIVATE=DIR in mpirun's environment, every host but the first sees its own empty DIR
# (a tmpfs in a mount namespace of its own): a folder the hosts do not share.
if [ -n "\${NETNS_PRIVATE:-}" ] && [ "\$i" -ne 1 ]; then
    exec ip netns exec cohort_h\${i}_$NETNS_ID unshare --uts --mount --propagation private sh -c \
        "hostname cohort-host\$i && mount -t tmpfs cohort-private '\$NETNS_PRIVATE' && \$*"
fi
exec ip netns exec cohort_h\${i}_$NETNS_ID unshare --uts sh -c "hostname cohort-host\$i && \$*"
AGENT
    chmod +x "$NETNS_DIR/netns-rsh"
}

netns_hostfile() {
    local i
    for ((i = 1; i <= NETNS_COUNT; i++)); do printf '%s slots=%s\n' "$NETNS_NET.$i" "$2"; done >"$1"
}

netns_mpirun_args() {
    printf '%s\n' --hostfile "$1" --mca plm_rsh_agent "$NETNS_DIR/netns-rsh" --mca btl tcp,vader,self \
        --mca btl_tcp_if_include "$NETNS_NET.0/24" --mca oob_tcp_if_include "$NETNS_NET.0/24"
}

netns_rate() {
    local i ns burst
    # tbf's bucket must hold at least one timer tick of traffic at the rate (HZ is 250 or more).
    case $1 in
        *gbit) burst=$(( ${1%gbit} * 1000000000 / 8 / 250 )) ;;
        *mbit) burst=$(( ${1%mbit} * 1000000 / 8 / 250 )) ;;
        off) burst=0 ;;
        *) echo "netns_rate: $1: expected Ngbit, Nmbit or off" >&2; return 1 ;;
    esac
    for ((i = 1; i <= NETNS_COUNT; i++)); do
        ns=cohort_h${i}_$NETNS_ID
        ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        [ "$1" = off ] && continue
        ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$1" burst "$burst" latency 50ms || return 1
    done
}
