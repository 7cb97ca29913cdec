#!/usr/bin/env bash
# A SqueezeNet's one SGD step (squeeze_step.py: torchvision's Fire modules and initialisation,
# ceil-mode pools, biases from zero) imported from ONNX and trained with --shuffle off on the first
# 8 MNIST images, on one device and on two: every parameter within float32 rounding of PyTorch's
# float64 step (within 4x PyTorch's own float32 distance, or 1e-5 of the update). Issue 41's bias
# outliers were a ReLU input within rounding of zero; the fixture is a seed without one.
# With MODEL gelu, the same for squeeze_step.py's GELU net (both GELU forms through ONNX, a 7x7
# depthwise conv); with unet, for its U-Net (nn.Upsample, a skip concatenation); with shuffle, for its
# ShuffleNetV2 (chunk, channel shuffle, BatchNorm: two devices with --sync-bn, so that the batch
# statistics and running averages are the whole batch's). The check also loads the checkpoint into
# the PyTorch module with strict=True. With convnext, for its ConvNeXt-style net (GELU, LayerNorm over
# the channels through permutes and over trailing dimensions).
# With twice, for a net that calls a conv and a linear module twice (shared weights; BatchNorm, so
# --sync-bn on two devices).
# With unet_t, for a U-Net whose decoder upsamples with nn.ConvTranspose2d; with unet_bilinear, one
# that resizes bilinearly (half-pixel x2 and align_corners to 10x10). With permute, for a net of
# x.permute orders beside LayerNorm's (h and w swapped, channels-last read by Sigmoid, c and h
# swapped, a channels-last view transposed again; BatchNorm, so --sync-bn on two devices).
# usage: squeeze_step.sh COHORT DATA_ROOT [squeeze|gelu|unet|unet_t|unet_bilinear|shuffle|convnext|twice|permute]
# PARITY_DEVICE=cuda trains on cuda:0 and cuda:0,cuda:1 (COHORT_CUDA_WRAP=1 on one GPU); PYTHON picks
# the interpreter with PyTorch.
set -uo pipefail
cohort=$1 data=$2 model=${3:-squeeze}
py=${PYTHON:-/usr/bin/python3}
kind=${PARITY_DEVICE:-cpu}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$py" "$here/squeeze_step.py" make "$tmp" "$data" "$model" || exit 1
fails=0
for devices in $kind:0 $kind:0,$kind:1; do
    echo "== $devices"
    sync=()
    case $model in shuffle | twice | permute) [ "$devices" != $kind:0 ] && sync=(--sync-bn) ;; esac
    "$cohort" train "${sync[@]}" --model "$tmp/model.onnx" --data "$data/mnist" --train-limit 8 -b 8 --epochs 1 --shuffle off \
        --lr 0.1 --devices "$devices" --checkpoint-dir "$tmp/ck-$devices" --test-limit 10 --no-progress ||
        { echo "FAIL: training on $devices"; fails=$((fails + 1)); continue; }
    "$py" "$here/squeeze_step.py" check "$tmp" "$data" "$tmp/ck-$devices/epoch-0001/model.safetensors" ||
        fails=$((fails + 1))
done
[ "$fails" -eq 0 ]
