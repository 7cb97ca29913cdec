#!/usr/bin/env bash
# scripts/bundle's folder, moved elsewhere, trains on the CPU with LD_LIBRARY_PATH unset, and every
# shared library the process initialises comes from the folder or from the C runtime.
#   bundle.sh BUILD_DIR DATA_DIR
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1 data=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$root/scripts/bundle" "$tmp/made" "$build" >/dev/null || { echo "FAIL: scripts/bundle"; exit 1; }
mkdir -p "$tmp/other/place" && mv "$tmp/made" "$tmp/other/place/cohort-bundle"
b=$tmp/other/place/cohort-bundle
cd "$tmp" || exit 1
env -u LD_LIBRARY_PATH LD_DEBUG=libs LD_DEBUG_OUTPUT="$tmp/ld" "$b/cohort" train --model lenet --data "$data/mnist" \
    --devices cpu:0,cpu:1 --epochs 1 --train-limit 512 --test-limit 256 -b 64 >"$tmp/out" 2>&1
rc=$?
tail -1 "$tmp/out"
[ $rc -eq 0 ] || { echo "FAIL: the bundled cohort exited $rc"; cat "$tmp/out"; exit 1; }
grep -q "^epoch 1, loss" "$tmp/out" || { echo "FAIL: no epoch line"; exit 1; }
loaded=$(cat "$tmp"/ld.* | sed -n 's/.*calling init: //p' | sort -u)
[ -n "$loaded" ] || { echo "FAIL: LD_DEBUG listed nothing"; exit 1; }
runtime='/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt|ld-linux-x86-64)\.so[.0-9]*$'
bad=0
for lib in $loaded; do
    case $lib in
        "$b"/*) ;;
        *) [[ $lib =~ $runtime ]] || { echo "FAIL: loaded from outside the bundle: $lib"; bad=1; } ;;
    esac
done
[ $bad -eq 0 ] || exit 1
echo "ok: $(echo "$loaded" | grep -c "^$b/") libraries from the bundle, the rest the C runtime"
