#!/usr/bin/env bash
# A checkpoint save asks for fsync on every file it writes (model, optimizer, trainer.json)
# and on the folders that hold them (the temporary folder, DIR after the rename, DIR after latest),
# before anything points at them: logged by an LD_PRELOAD shim (fsync_count.c) around fsync().
#   fsync.sh COHORT SHIM DATA_ROOT
set -uo pipefail
cohort=$1 shim=$2 data=$3/mnist
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { if [ "$2" -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
log=$tmp/fsync.log
env LD_PRELOAD="$shim" COHORT_FSYNC_LOG="$log" "$cohort" train --model lenet --data "$data" --epochs 1 \
    --train-limit 256 --test-limit 64 -b 64 --no-progress --checkpoint-dir "$tmp/ck" >/dev/null
ok "training with the shim" $?
cat "$log" 2>/dev/null
for f in model.safetensors optimizer.safetensors trainer.json; do
    grep -q "/ck/.cohort-tmp-epoch-0001-[0-9]*/$f\$" "$log"
    ok "$f fsynced in the temporary folder" $?
done
grep -q "/ck/.cohort-tmp-epoch-0001-[0-9]*\$" "$log"; ok "the temporary folder fsynced" $?
[ -L "$tmp/ck/latest" ]; ok "latest is a symbolic link (renamed into place, then the folder synced)" $?
[ "$(grep -c "/ck\$" "$log")" -ge 2 ]; ok "the checkpoint folder fsynced after each rename" $?
# And --out, --plot: an output replaced by rename is synced first.
env LD_PRELOAD="$shim" COHORT_FSYNC_LOG="$log" "$cohort" export --checkpoint "$tmp/ck" --out "$tmp/w.safetensors"
grep -q "/w.safetensors.tmp-cohort-[0-9]*\$" "$log"; ok "export's file fsynced before the rename" $?
echo "fsync: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
