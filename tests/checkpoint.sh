#!/usr/bin/env bash
# Checkpoints end to end, on a subset of real Fashion-MNIST:
#  - 2 epochs straight == 1 epoch, stop, --resume for 1 more: bit-identical model and optimizer
#    files (1 device, 2 devices and 2 ranks); also after a SIGKILL mid-epoch, from the last step
#    checkpoint;
#  - a save killed at any stage leaves `latest` naming a complete checkpoint, and resuming from it
#    still ends bit-identical;
#  - trained on 2 devices (and on 2 MPI ranks), evaluated on 1 device: the accuracy of that epoch;
#  - export, a `module.` prefix, and every kind of checkpoint that does not fit: one line, exit 2.
#   checkpoint.sh COHORT DATA_ROOT [MPIRUN...]
set -uo pipefail
cohort=$1 data=$2/fashion-mnist; shift 2
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { if [ "$2" -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
same() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/optimizer.safetensors" "$2/optimizer.safetensors"; }

A=(train --model lenet --data "$data" --train-limit 2000 --test-limit 1000 -b 64 --lr 0.05 --momentum 0.9
   --seed 4 --no-progress)

for devs in cpu:0 cpu:0,cpu:1; do
    c=$tmp/$devs
    "$cohort" "${A[@]}" --devices $devs --epochs 2 --checkpoint-dir "$c/straight" >/dev/null
    "$cohort" "${A[@]}" --devices $devs --epochs 1 --checkpoint-dir "$c/split" >/dev/null
    "$cohort" "${A[@]}" --devices $devs --epochs 2 --checkpoint-dir "$c/split" --resume >/dev/null
    same "$c/straight/epoch-0002" "$c/split/epoch-0002"
    rc=$?; ok "[$devs] 2 epochs == 1 + resume 1: bit-identical" $rc
    # Killed (SIGKILL) at step 45 of 64; the step checkpoints came every 20 steps.
    env COHORT_INJECT_FAULT=kill:0:45 "$cohort" "${A[@]}" --devices $devs --epochs 2 \
        --checkpoint-dir "$c/killed" --checkpoint-every 20 >/dev/null 2>&1
    [ "$(readlink "$c/killed/latest")" = step-00000040 ]
    rc=$?; ok "[$devs] after the kill at step 45, latest is step-00000040 (got $(readlink "$c/killed/latest"))" $rc
    "$cohort" "${A[@]}" --devices $devs --epochs 2 --checkpoint-dir "$c/killed" --checkpoint-every 20 --resume >/dev/null
    same "$c/straight/epoch-0002" "$c/killed/epoch-0002"
    rc=$?; ok "[$devs] killed mid-epoch, resumed from the step checkpoint: bit-identical" $rc
done

# On the lazy backend (memory stored scrambled, work run only when waited for: kernels/backend.h),
# 1 epoch + resume with Adam on 2 devices writes the CPU backend's straight run's files bit for bit,
# and prints the same losses and accuracies: a checkpoint that saved or restored replica memory
# without the backend, or before the work that wrote it had run, would differ.
AS=(train --model mnist-cnn --data "$data" --train-limit 1000 --test-limit 200 -b 50 --optimizer adam --lr 0.002
    --seed 4 --no-progress --devices cpu:0,cpu:1)
figures() { sed -E 's/, time .*//' "$1"; }
"$cohort" "${AS[@]}" --epochs 2 --checkpoint-dir "$tmp/s_cpu" >"$tmp/s_cpu.out"
"$cohort" "${AS[@]}" --devices lazy:0,lazy:1 --epochs 1 --checkpoint-dir "$tmp/s_lazy" >"$tmp/s_lazy.out"
"$cohort" "${AS[@]}" --devices lazy:0,lazy:1 --epochs 2 --checkpoint-dir "$tmp/s_lazy" --resume >>"$tmp/s_lazy.out"
same "$tmp/s_cpu/epoch-0002" "$tmp/s_lazy/epoch-0002"
rc=$?; ok "[lazy backend] 1 epoch + resume == the CPU backend's 2 epochs: bit-identical" $rc
diff <(figures "$tmp/s_cpu.out") <(figures "$tmp/s_lazy.out")
rc=$?; ok "[lazy backend] the same epoch lines as the CPU backend's" $rc

# Adam's state (exp_avg, exp_avg_sq, step) resumes bit for bit too; another optimizer is refused.
c=$tmp/adam
AD=(train --model lenet --data "$data" --train-limit 2000 --test-limit 1000 -b 64 --optimizer adam --lr 0.002
    --seed 4 --no-progress)
"$cohort" "${AD[@]}" --epochs 2 --checkpoint-dir "$c/straight" >/dev/null
"$cohort" "${AD[@]}" --epochs 1 --checkpoint-dir "$c/split" >/dev/null
"$cohort" "${AD[@]}" --epochs 2 --checkpoint-dir "$c/split" --resume >/dev/null
same "$c/straight/epoch-0002" "$c/split/epoch-0002"
rc=$?; ok "[adam] 2 epochs == 1 + resume 1: bit-identical" $rc

# A save killed at each stage: the previous checkpoint stays complete and named by latest.
for stage in model optimizer trainer rename latest; do
    c=$tmp/crash-$stage
    "$cohort" "${A[@]}" --epochs 1 --checkpoint-dir "$c" >/dev/null
    env COHORT_INJECT_CKPT_CRASH=$stage "$cohort" "${A[@]}" --epochs 2 --checkpoint-dir "$c" --resume >/dev/null 2>&1
    want=epoch-0001; [ $stage = latest ] && want=epoch-0002
    [ "$(readlink "$c/latest")" = $want ] && "$cohort" eval --checkpoint "$c" --data "$data" --test-limit 10 >/dev/null
    rc=$?; ok "crash after '$stage' while saving: latest is $want and loads" $rc
    "$cohort" "${A[@]}" --epochs 2 --checkpoint-dir "$c" --resume >/dev/null
    same "$tmp/cpu:0/straight/epoch-0002" "$c/epoch-0002" && ! ls -d "$c"/.cohort-tmp-* "$c"/.cohort-old-* 2>/dev/null
    rc=$?; ok "crash after '$stage', then resumed: bit-identical, no leftovers" $rc
done

# The folder is the user's: their own .tmp-*, .old-* and .latest.* entries survive a save; a second
# trainer on the same folder is refused while the first holds its lock.
c=$tmp/mine; mkdir -p "$c/.tmp-notes" "$c/.old-photos"; echo keep >"$c/.latest.txt"; echo keep >"$c/.tmp-x"
"$cohort" "${A[@]}" --epochs 1 --checkpoint-dir "$c" >/dev/null
[ -d "$c/.tmp-notes" ] && [ -d "$c/.old-photos" ] && [ -f "$c/.latest.txt" ] && [ -f "$c/.tmp-x" ] && [ -d "$c/epoch-0001" ]
rc=$?; ok "the user's own dot entries in --checkpoint-dir survive" $rc
"$cohort" "${A[@]}" --epochs 30 --checkpoint-dir "$tmp/locked" >/dev/null 2>&1 &
first=$!
for _ in $(seq 100); do [ -s "$tmp/locked/.cohort-lock" ] && break; sleep 0.1; done
"$cohort" "${A[@]}" --epochs 1 --checkpoint-dir "$tmp/locked" >/dev/null 2>"$tmp/err"; got=$?
kill "$first" 2>/dev/null; wait "$first" 2>/dev/null
[ $got -eq 2 ] && grep -q "another cohort (pid $first) is writing checkpoints there" "$tmp/err"
rc=$?; ok "a second trainer on a locked folder: one line, exit 2 ($(cat "$tmp/err"))" $rc
# latest names an entry of its own folder, nothing else.
for evil in .. . ../.. /etc epoch-0001/../..; do
    mkdir -p "$tmp/evil"; printf '%s\n' "$evil" >"$tmp/evil/latest"
    "$cohort" eval --checkpoint "$tmp/evil" --data "$data" --test-limit 10 >/dev/null 2>"$tmp/err"; got=$?
    [ $got -eq 2 ] && grep -q "does not name a checkpoint of this folder" "$tmp/err"
    rc=$?; ok "latest = '$evil': refused ($(cat "$tmp/err"))" $rc
done

# Trained on 2 devices, evaluated on 1: the same test accuracy as the training run printed.
acc_of_epoch() { sed -n "s/^epoch $1, .*test acc \([0-9.]*\),.*/\1/p" "$2"; }
acc_of_eval() { sed -n 's/^test loss [0-9.]*, test acc \([0-9.]*\) .*/\1/p' "$1"; }
"$cohort" "${A[@]}" --devices cpu:0,cpu:1 --epochs 2 --checkpoint-dir "$tmp/two" >"$tmp/two.out"
"$cohort" eval --checkpoint "$tmp/two/epoch-0001" --data "$data" --test-limit 1000 >"$tmp/e1.out"
"$cohort" eval --checkpoint "$tmp/two" --data "$data" --test-limit 1000 --devices 'cpu*3' --per-class >"$tmp/e2.out"
[ -n "$(acc_of_epoch 1 "$tmp/two.out")" ] && [ "$(acc_of_epoch 1 "$tmp/two.out")" = "$(acc_of_eval "$tmp/e1.out")" ] &&
    [ "$(acc_of_epoch 2 "$tmp/two.out")" = "$(acc_of_eval "$tmp/e2.out")" ]
rc=$?; ok "2 devices trained, 1 and 3 evaluated: $(acc_of_epoch 1 "$tmp/two.out")/$(acc_of_eval "$tmp/e1.out"), $(acc_of_epoch 2 "$tmp/two.out")/$(acc_of_eval "$tmp/e2.out")" $rc
[ "$(grep -cE '^[0-9] +[0-9]+ +[0-9]+ +[0-9.]+$' "$tmp/e2.out")" -eq 10 ] &&
    [ "$(awk '/^[0-9] /{s += $2} END {print s}' "$tmp/e2.out")" -eq 1000 ]
rc=$?; ok "--per-class: 10 rows covering the 1000 images" $rc
if [ ${#mpirun[@]} -gt 0 ]; then
    "${mpirun[@]}" -np 2 "$cohort" "${A[@]}" --epochs 1 --checkpoint-dir "$tmp/ranks" --checkpoint-every 10 >"$tmp/ranks.out"
    "$cohort" eval --checkpoint "$tmp/ranks" --data "$data" --test-limit 1000 >"$tmp/e3.out"
    [ -n "$(acc_of_eval "$tmp/e3.out")" ] && [ "$(acc_of_epoch 1 "$tmp/ranks.out")" = "$(acc_of_eval "$tmp/e3.out")" ]
    rc=$?; ok "2 ranks trained, 1 device evaluated: $(acc_of_epoch 1 "$tmp/ranks.out")/$(acc_of_eval "$tmp/e3.out")" $rc
    "${mpirun[@]}" -np 2 "$cohort" eval --checkpoint "$tmp/two" --data "$data" --test-limit 1000 >"$tmp/e6.out"
    [ "$(acc_of_eval "$tmp/e6.out")" = "$(acc_of_epoch 2 "$tmp/two.out")" ] && grep -q ' x 2 ranks$' "$tmp/e6.out"
    rc=$?; ok "2 devices trained, 2 ranks evaluated: $(acc_of_eval "$tmp/e6.out")" $rc
    # 2 ranks: 2 epochs straight == 1 epoch + --resume, bit for bit (every rank's replicas take the
    # checkpoint's state and optimizer step count, not only rank 0's).
    "${mpirun[@]}" -np 2 "$cohort" "${A[@]}" --epochs 2 --checkpoint-dir "$tmp/mstraight" >/dev/null
    "${mpirun[@]}" -np 2 "$cohort" "${A[@]}" --epochs 1 --checkpoint-dir "$tmp/msplit" >/dev/null
    "${mpirun[@]}" -np 2 "$cohort" "${A[@]}" --epochs 2 --checkpoint-dir "$tmp/msplit" --resume >/dev/null
    same "$tmp/mstraight/epoch-0002" "$tmp/msplit/epoch-0002"
    rc=$?; ok "[2 ranks] 2 epochs == 1 + resume 1: bit-identical" $rc
    # --resume auto: one command line, run until it succeeds. The first run starts fresh and is
    # SIGKILLed on rank 1 at step 45 of 64 (mpirun then ends the job); the same command run again
    # resumes from step 40 and ends bit-identical to the straight run.
    RA=("${mpirun[@]}" -np 2 "$cohort" "${A[@]}" --epochs 2 --checkpoint-dir "$tmp/mauto" --checkpoint-every 20 --resume auto)
    "${mpirun[@]}" -np 2 -x COHORT_INJECT_FAULT=kill:1:45 "$cohort" "${A[@]}" --epochs 2 --checkpoint-dir "$tmp/mauto" \
        --checkpoint-every 20 --resume auto >"$tmp/auto1.out" 2>&1
    rc1=$?
    "${RA[@]}" >"$tmp/auto2.out" 2>&1
    rc2=$?
    [ $rc1 -ne 0 ] && [ $rc2 -eq 0 ] && grep -q "no checkpoint in .* yet, starting fresh" "$tmp/auto1.out" &&
        grep -q "resuming from .*mauto" "$tmp/auto2.out" && same "$tmp/mstraight/epoch-0002" "$tmp/mauto/epoch-0002"
    rc=$?; ok "[2 ranks] --resume auto: killed at step 45 (exit $rc1), the same command again: bit-identical" $rc
    # Run once more, it has nothing left to do and says so; a latest that names no checkpoint is an
    # error, never a fresh start over the user's progress.
    "${RA[@]}" >"$tmp/auto3.out" 2>&1 && grep -q "nothing to train" "$tmp/auto3.out"
    rc=$?; ok "[2 ranks] --resume auto after the end: nothing to train" $rc
    rm -f "$tmp/mauto/latest"; echo step-99999999 >"$tmp/mauto/latest"
    "${RA[@]}" >"$tmp/auto4.out" 2>&1
    [ $? -eq 2 ] && grep -q "step-99999999" "$tmp/auto4.out"
    rc=$?; ok "[2 ranks] --resume auto with a dangling latest: refused ($(head -c 200 "$tmp/auto4.out"))" $rc
    # Resumed on another shape of job (2 ranks -> 1 process, 3 devices): it goes on from the same
    # state and position as a resume on 1 device does, so epoch 2 reports the same figures up to
    # the order of float sums (a lost momentum buffer or position would not).
    cp -r "$tmp/ranks" "$tmp/ranks1"
    "$cohort" "${A[@]}" --epochs 2 --devices 'cpu*3' --checkpoint-dir "$tmp/ranks" --resume >"$tmp/r3.out"
    "$cohort" "${A[@]}" --epochs 2 --checkpoint-dir "$tmp/ranks1" --resume >"$tmp/r1.out"
    fig() { sed -n 's/^epoch 2, loss \([0-9.]*\), train acc \([0-9.]*\), test acc \([0-9.]*\),.*/\1 \2 \3/p' "$1"; }
    paste <(fig "$tmp/r3.out") <(fig "$tmp/r1.out") | awk 'NF == 6 { n++; d = $1 - $4; if (d < 0) d = -d;
        a = $2 - $5; if (a < 0) a = -a; b = $3 - $6; if (b < 0) b = -b; if (d > 1e-3 * $4 || a > 0.002 || b > 0.002) bad++ }
        END { exit !(n == 1 && !bad) }' && ! grep -q '^epoch 1, ' "$tmp/r3.out"
    rc=$?; ok "a 2-rank checkpoint resumes on 1 process with 3 devices as on 1: $(fig "$tmp/r3.out") / $(fig "$tmp/r1.out")" $rc
fi

# Export: the weights alone; PyTorch's DataParallel prefix is stripped on load.
"$cohort" export --checkpoint "$tmp/two" --out "$tmp/w.safetensors" &&
    "$cohort" eval --checkpoint "$tmp/w.safetensors" --model lenet --data "$data" --test-limit 1000 >"$tmp/e4.out"
[ "$(acc_of_eval "$tmp/e4.out")" = "$(acc_of_epoch 2 "$tmp/two.out")" ]
rc=$?; ok "export, then evaluate the exported file" $rc
python3 "$here/st_edit.py" "$tmp/w.safetensors" "$tmp/module.safetensors" prefix module.
"$cohort" eval --checkpoint "$tmp/module.safetensors" --model lenet --data "$data" --test-limit 1000 >"$tmp/e5.out"
[ "$(acc_of_eval "$tmp/e5.out")" = "$(acc_of_epoch 2 "$tmp/two.out")" ]
rc=$?; ok "a module.-prefixed state_dict loads" $rc

# Checkpoints that do not fit: one line naming file, tensor and mismatch; exit 2.
expect() { # needle -- command
    local needle=$1; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
    # (ASan, in the sanitizer pass, notes a refused impossible allocation on a line of its own.)
    [ $got -eq 2 ] && grep -qF -- "$needle" "$tmp/err" &&
        [ "$(grep -cv 'WARNING: AddressSanitizer failed to allocate' "$tmp/err")" -eq 1 ]
    rc=$?; ok "$* -> exit $got, want 2 and '$needle': $(cat "$tmp/err")" $rc
}
# Nothing of the user's is lost: a latest that exists but cannot be read (a dangling symlink, a
# symlink loop) is an error, never a fresh start; a fresh run into a folder that holds another
# run's checkpoints is refused unless --overwrite (or --resume), with or without a latest; and
# every refusal leaves the folder as it was.
contents() { (cd "$1" && find . -mindepth 1 -not -name '.cohort*' | sort | while read -r f; do
    if [ -L "$f" ]; then echo "$f -> $(readlink "$f")"; elif [ -f "$f" ]; then md5sum "$f"; else echo "$f/"; fi
    done | md5sum); }
for kind in dangling loop nolatest fresh; do
    rm -rf "$tmp/keep_$kind"; cp -r "$tmp/two" "$tmp/keep_$kind"
    case $kind in
        dangling) rm "$tmp/keep_$kind/latest"; ln -s epoch-0042 "$tmp/keep_$kind/latest"; flags=(--resume auto) ;;
        loop) rm "$tmp/keep_$kind/latest"; ln -s latest "$tmp/keep_$kind/latest"; flags=(--resume auto) ;;
        nolatest) rm "$tmp/keep_$kind/latest"; flags=(--resume auto) ;;
        fresh) flags=() ;;
    esac
    before=$(contents "$tmp/keep_$kind")
    "$cohort" "${A[@]}" --epochs 1 --checkpoint-dir "$tmp/keep_$kind" "${flags[@]}" >"$tmp/out" 2>"$tmp/err"; got=$?
    after=$(contents "$tmp/keep_$kind")
    case $kind in
        dangling) needle="latest: a symbolic link that cannot be followed (No such file or directory)" ;;
        loop) needle="latest: a symbolic link that cannot be followed (Too many levels of symbolic links)" ;;
        *) needle="already holds checkpoints" ;;
    esac
    [ $got -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/err" && [ "$before" = "$after" ] &&
        ! grep -q "starting fresh" "$tmp/out"
    rc=$?; ok "a folder with checkpoints ($kind) is not overwritten: exit $got, $(cat "$tmp/err")" $rc
done
"$cohort" "${A[@]}" --epochs 1 --checkpoint-dir "$tmp/keep_fresh" --overwrite >"$tmp/out" 2>&1 &&
    [ -d "$tmp/keep_fresh/epoch-0001" ] && [ "$(readlink "$tmp/keep_fresh/latest")" = epoch-0001 ]
rc=$?; ok "--overwrite: a fresh run replaces them" $rc

# latest is a symbolic link to the entry, so DIR/latest/FILE is a path for any program (torch.load,
# safetensors, cohort eval --checkpoint DIR/latest); a text file naming the entry (what cohort wrote
# before 0.x, or a user's echo) still works.
c=$tmp/keep_fresh
[ -L "$c/latest" ] && [ -f "$c/latest/model.safetensors" ] && cmp -s "$c/latest/model.safetensors" "$c/epoch-0001/model.safetensors" &&
    "$cohort" eval --checkpoint "$c/latest" --data "$data" --test-limit 10 >"$tmp/l1" &&
    rm "$c/latest" && echo epoch-0001 >"$c/latest" &&
    "$cohort" eval --checkpoint "$c" --data "$data" --test-limit 10 >"$tmp/l2" && cmp -s "$tmp/l1" "$tmp/l2" &&
    "$cohort" "${A[@]}" --epochs 2 --checkpoint-dir "$c" --resume >/dev/null && [ "$(readlink "$c/latest")" = epoch-0002 ]
rc=$?; ok "latest: a symbolic link (DIR/latest/model.safetensors opens, eval DIR/latest); a text latest still resumes" $rc

E=(eval --data "$data" --test-limit 100)
bad() { mkdir -p "$tmp/bad"; rm -f "$tmp/bad"/*; cp "$tmp/two/epoch-0002"/* "$tmp/bad/"; }
expect "a checkpoint of lenet, but the model is mlp" -- "$cohort" train --model mlp --data "$data" --checkpoint-dir "$tmp/two" --resume --epochs 3
expect "trained with --seed 4, this run has --seed 5" -- "$cohort" "${A[@]}" --seed 5 --checkpoint-dir "$tmp/two" --resume --epochs 3
expect "tensor '0.weight' has shape [20x1x3x3], the model needs [20x1x5x5]" -- "$cohort" "${E[@]}" --checkpoint "$tmp/w.safetensors" --model mnist-cnn
bad; python3 "$here/st_edit.py" "$tmp/two/epoch-0002/model.safetensors" "$tmp/bad/model.safetensors" drop 3.bias
expect "model.safetensors: tensor '3.bias' is missing" -- "$cohort" "${E[@]}" --checkpoint "$tmp/bad"
bad; python3 "$here/st_edit.py" "$tmp/two/epoch-0002/model.safetensors" "$tmp/bad/model.safetensors" dtype 7.weight F8
expect "model.safetensors: tensor '7.weight': unknown dtype F8" -- "$cohort" "${E[@]}" --checkpoint "$tmp/bad"
bad; python3 "$here/st_edit.py" "$tmp/two/epoch-0002/model.safetensors" "$tmp/bad/model.safetensors" dtype 7.weight F64
expect "model.safetensors: tensor '7.weight'" -- "$cohort" "${E[@]}" --checkpoint "$tmp/bad"
bad; head -c 100000 "$tmp/two/epoch-0002/model.safetensors" >"$tmp/bad/model.safetensors"
expect "(is the file truncated?)" -- "$cohort" "${E[@]}" --checkpoint "$tmp/bad"
bad; : >"$tmp/bad/optimizer.safetensors"
expect "optimizer.safetensors: 0 bytes, too short" -- "$cohort" "${A[@]}" --epochs 3 --resume "$tmp/bad"
bad; sed -i 's/"format_version":\t1/"format_version":\t2/' "$tmp/bad/trainer.json"
expect "trainer.json: format version 2 is newer than this cohort reads (1)" -- "$cohort" "${A[@]}" --epochs 3 --resume "$tmp/bad"
expect "trained with --optimizer adam, this run has sgd" -- "$cohort" "${A[@]}" --checkpoint-dir "$tmp/adam/straight" --resume --epochs 3
expect "no checkpoint here" -- "$cohort" "${A[@]}" --checkpoint-dir "$tmp/empty" --resume
expect "--resume without a PATH needs --checkpoint-dir" -- "$cohort" "${A[@]}" --resume
expect "--resume auto needs --checkpoint-dir" -- "$cohort" "${A[@]}" --resume auto
expect "has no checkpoint yet, so --model is needed" -- "$cohort" train --data "$data" --checkpoint-dir "$tmp/empty" --resume auto
expect "a bare safetensors file needs --model" -- "$cohort" "${E[@]}" --checkpoint "$tmp/w.safetensors"
# A FIFO where latest or a checkpoint file is expected: one line at once, never a wait. (These
# stood above expect's and bad's definitions and ran as "command not found", counted by nothing.)
mkdir -p "$tmp/fifo"; mkfifo "$tmp/fifo/latest"
expect "latest: is a FIFO, expected a file" -- timeout 20 "$cohort" eval --checkpoint "$tmp/fifo" --data "$data" --test-limit 10
bad; rm "$tmp/bad/model.safetensors"; mkfifo "$tmp/bad/model.safetensors"
expect "model.safetensors: is a FIFO, expected a file" -- timeout 20 "$cohort" "${E[@]}" --checkpoint "$tmp/bad"

# trainer.json is checked for type, integrality and range against the data and the flags.
tj() { # FILE KEY[.KEY] JSON-VALUE: set one field
    python3 -c 'import json,sys; f,k,v=sys.argv[1:]; d=json.load(open(f)); o=d
for p in k.split(".")[:-1]: o=o[p]
o[k.split(".")[-1]]=json.loads(v); json.dump(d,open(f,"w"))' "$@"
}
mid=$tmp/cpu:0/killed/step-00000040
badmid() { mkdir -p "$tmp/bad"; rm -f "$tmp/bad"/*; cp "$mid"/* "$tmp/bad/"; }
badmid; tj "$tmp/bad/trainer.json" data_order.samples_seen 999999
expect "samples_seen 999999 and step_in_epoch 8 do not fit an epoch of 2000 samples" -- "$cohort" "${A[@]}" --epochs 2 --resume "$tmp/bad"
badmid; tj "$tmp/bad/trainer.json" data_order.samples_seen 2000
expect "do not fit an epoch of 2000 samples" -- "$cohort" "${A[@]}" --epochs 2 --resume "$tmp/bad"
# A consistent step and count, but past the epoch's end (32 x 64 = 2048 > 2000).
badmid; tj "$tmp/bad/trainer.json" data_order.samples_seen 2048; tj "$tmp/bad/trainer.json" step_in_epoch 32
expect "samples_seen 2048 and step_in_epoch 32 do not fit an epoch of 2000 samples" -- "$cohort" "${A[@]}" --epochs 2 --resume "$tmp/bad"
badmid; tj "$tmp/bad/trainer.json" epoch 0.5
expect "'epoch' is 0.5, expected a whole number" -- "$cohort" "${A[@]}" --epochs 2 --resume "$tmp/bad"
badmid; tj "$tmp/bad/trainer.json" step_in_epoch 1e12
expect "step_in_epoch 1000000000000 do not fit" -- "$cohort" "${A[@]}" --epochs 2 --resume "$tmp/bad"
badmid; tj "$tmp/bad/trainer.json" data_order.correct '"many"'
expect "'correct' is missing or not a number" -- "$cohort" "${A[@]}" --epochs 2 --resume "$tmp/bad"
badmid; sed -i '0,/{/s/{/{"epoch": 0, /' "$tmp/bad/trainer.json"
expect "trainer.json: the key 'epoch' appears twice" -- "$cohort" "${A[@]}" --epochs 2 --resume "$tmp/bad"
expect "stopped inside an epoch with --batch-size 64, this run has 32" -- "$cohort" "${A[@]}" -b 32 --epochs 2 --resume "$mid"

# A setting that came from trainer.json is named as such, not as a flag.
bad; tj "$tmp/bad/trainer.json" config.normalize '"1,2,3/1,1,1"'
expect "trainer.json's config.normalize '1,2,3/1,1,1' does not fit this data" -- "$cohort" "${E[@]}" --checkpoint "$tmp/bad"
# A trainer.json that asks for an absurd model is refused before anything is allocated.
bad; tj "$tmp/bad/trainer.json" input '[1, 100000, 100000]'
expect "input dimension 1 is 100000, expected a whole number 1..4096" -- "$cohort" export --checkpoint "$tmp/bad" --out "$tmp/x.safetensors"
expect "resnet18's activations for a slice of 60000 samples do not fit in memory" -- "$cohort" train --model resnet18 --data "$data" --train-limit 64 --test-limit 10 -b 60000 --no-progress

# Values training cannot start from are refused with the tensor named (--allow-nonfinite overrides).
bad; python3 "$here/st_edit.py" "$tmp/two/epoch-0002/model.safetensors" "$tmp/bad/model.safetensors" set 3.weight nan
expect "tensor '3.weight' holds nan at element 0" -- "$cohort" "${E[@]}" --checkpoint "$tmp/bad"
expect "tensor '3.weight' holds nan at element 0" -- "$cohort" "${A[@]}" --epochs 3 --resume "$tmp/bad"
"$cohort" "${E[@]}" --checkpoint "$tmp/bad" --allow-nonfinite >"$tmp/out" 2>&1
ok "--allow-nonfinite evaluates it anyway: $(cat "$tmp/out")" $?
bad; python3 "$here/st_edit.py" "$tmp/two/epoch-0002/optimizer.safetensors" "$tmp/bad/optimizer.safetensors" set 0.weight.momentum_buffer inf
expect "tensor '0.weight.momentum_buffer' holds inf" -- "$cohort" "${A[@]}" --epochs 3 --resume "$tmp/bad"
# A run that diverges records its metrics so that its own checkpoint reads back, and says so.
"$cohort" "${A[@]}" --lr 1e6 --epochs 1 --checkpoint-dir "$tmp/diverged" >"$tmp/out" 2>&1
grep -q "not finite: training diverged" "$tmp/out"
ok "a diverged epoch says so in its line: $(cat "$tmp/out")" $?
expect "holds nan" -- "$cohort" "${A[@]}" --lr 1e6 --epochs 2 --checkpoint-dir "$tmp/diverged" --resume
"$cohort" "${A[@]}" --lr 1e6 --epochs 2 --checkpoint-dir "$tmp/diverged" --resume --allow-nonfinite >"$tmp/out" 2>&1
ok "a diverged run resumes its own checkpoint with --allow-nonfinite: $(cat "$tmp/out")" $?
# BatchNorm's running variance may not be negative.
"$cohort" train --model resnet18 --data "$data" --train-limit 64 --test-limit 32 -b 32 --epochs 1 \
    --no-progress --checkpoint-dir "$tmp/bn" >/dev/null 2>&1
mkdir -p "$tmp/bnbad"; cp "$tmp/bn/epoch-0001"/* "$tmp/bnbad/"
python3 "$here/st_edit.py" "$tmp/bn/epoch-0001/model.safetensors" "$tmp/bnbad/model.safetensors" set 1.running_var -1
expect "tensor '1.running_var' holds a negative variance -1" -- "$cohort" "${E[@]}" --checkpoint "$tmp/bnbad"

echo "checkpoint: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
