#!/usr/bin/env bash
# nn.AvgPool2d(k, s, padding=p) as users write it: PyTorch exports count_include_pad=True (its
# default) as Pad + AveragePool, which cohort folds into one padded pooling that counts the zeros;
# count_include_pad=False exports as one AveragePool. For both, cohort's loss on 64 Fashion-MNIST
# images at the file's weights (--lr 0) is PyTorch's within 1e-5. A reflect Pad is refused naming it.
# usage: onnx_avgpool.sh COHORT DATA_ROOT
set -uo pipefail
cohort=$1 data=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
check() { if [ "$2" -eq 0 ]; then passes=$((passes + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi; }

/usr/bin/python3 - "$here" "$tmp" "$data/fashion-mnist" <<'PY' || exit 1
import sys, warnings
import torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
from graph_parity import as_batch, read_idx
out = sys.argv[2]

class Net(nn.Module):
    def __init__(self, include_pad):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.AvgPool2d(3, 2, padding=1, count_include_pad=include_pad)
        self.fc = nn.Linear(4 * 14 * 14, 10)

    def forward(self, x):
        x = F.relu(self.conv(x))
        x = self.pool(x)
        return self.fc(x.flatten(1))

def export(m, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, torch.zeros(2, 1, 28, 28), f"{out}/{name}.onnx", opset_version=13,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})

x, y = as_batch(*read_idx(sys.argv[3], "train", 64))
for include in (True, False):
    torch.manual_seed(3)
    m = Net(include)
    with torch.no_grad():   # the padded borders' averages weigh in the loss (at init they barely do)
        m.conv.bias.fill_(1.0)
        m.fc.weight.mul_(20)
    export(m, f"pool{int(include)}")
    with torch.no_grad():
        open(f"{out}/pool{int(include)}.loss", "w").write("%.6f\n" % F.cross_entropy(m(x), y).item())
import onnx
from onnx import helper
m = onnx.load(f"{out}/pool1.onnx")
pad = next(n for n in m.graph.node if n.op_type == "Pad")
del pad.attribute[:]
pad.attribute.append(helper.make_attribute("mode", "reflect"))
onnx.save(m, f"{out}/reflect.onnx")
PY

for include in 1 0; do
    "$cohort" train --model "$tmp/pool$include.onnx" --data "$data/fashion-mnist" --train-limit 64 --test-limit 64 -b 16 \
        --epochs 1 --lr 0 --no-progress --metrics "$tmp/m$include" >"$tmp/out" 2>&1
    got=$(sed -n 's/.*"loss": \([0-9.]*\),.*/\1/p' "$tmp/m$include") want=$(cat "$tmp/pool$include.loss")
    awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5) }'
    rc=$?; check "count_include_pad=$include: cohort's loss $got, PyTorch's $want ($(cat "$tmp/out"))" $rc
done
"$cohort" train --model "$tmp/reflect.onnx" --data "$data/fashion-mnist" --train-limit 64 --test-limit 64 --no-progress \
    >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "(Pad): only constant padding is supported" "$tmp/err"
rc=$?; check "a reflect Pad: $(cat "$tmp/err")" $rc
echo "onnx_avgpool: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
