"""Hostile and careless ONNX files for onnx_hostile.sh, each made from a real PyTorch training export
by one edit (with Debian's python3-onnx), and the line cohort must answer each with:

  python3 onnx_hostile.py DIR    writes DIR/good.onnx, DIR/NAME.onnx for each case, and DIR/cases
                                 (NAME<TAB>the text cohort's one line must contain)
"""
import os
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import helper, numpy_helper, TensorProto

sys.path.insert(0, os.path.dirname(__file__))
from torch_export import export as onnx_export  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 14 * 14, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        return self.fc(x.view(x.size(0), -1))


class FixedBatch(Net):
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        return self.fc(x.view(2, -1))


class MidSoftmax(Net):
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        return self.fc(F.log_softmax(x.view(x.size(0), -1), dim=1))


class NormAfterRelu(Net):
    """BatchNorm after the ReLU: an eval export cannot fold it into the conv."""
    def forward(self, x):
        x = F.max_pool2d(self.bn1(F.relu(self.conv1(x))), 2)
        return self.fc(x.view(x.size(0), -1))


class ColourNet(Net):
    """For colour images: a model for other data than the run's."""
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)


class ExpandIntoConv(Net):
    """y.expand_as(x) read by a convolution: only a broadcasting Add or Mul may read an Expand."""
    def __init__(self):
        super().__init__()
        self.conv2 = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(self.conv2(x.mean((2, 3), keepdim=True).expand_as(x)), 2)
        return self.fc(x.view(x.size(0), -1))


class WideExpand(Net):
    """s.expand_as(x) + s: the sum's own broadcast is (4, 1, 1), the Expand's (4, 28, 28)."""
    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        s = x.mean((2, 3), keepdim=True)
        x = F.max_pool2d(x * (s.expand_as(x) + s), 2)
        return self.fc(x.view(x.size(0), -1))


class ThreeDims(Net):
    """x.view(n, c, -1): a (batch, c, h*w) tensor, which cohort has no shape for."""
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        return self.fc(x.view(x.size(0), 4, -1).view(x.size(0), -1))


class HalfUnsqueeze(Net):
    """sigmoid of a (batch, c, 1) tensor: a shape cohort has no tensor for, between two unsqueezes."""
    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x * torch.sigmoid(x.mean((2, 3)).unsqueeze(-1)).unsqueeze(-1), 2)
        return self.fc(x.view(x.size(0), -1))


class Upsampled(Net):
    """A U-Net's decoder step: upsample (bicubic, which cohort does not import yet; nearest and
    bilinear it does), concatenate with the skip connection."""
    def __init__(self):
        super().__init__()
        self.up1 = nn.Upsample(scale_factor=2, mode="bicubic")
        self.fc = nn.Linear(8 * 14 * 14, 10)

    def forward(self, x):
        skip = F.relu(self.bn1(self.conv1(x)))
        x = torch.cat([self.up1(F.max_pool2d(skip, 2)), skip], 1)
        return self.fc(F.max_pool2d(x, 2).view(x.size(0), -1))


class Shuffled(Net):
    """A view into 2 channel groups, as ShuffleNet's shuffle begins, then (move) what the shuffle
    does not do: cohort imports the shuffle (squeeze_step.py's ShuffleNet), not other permutations."""
    def __init__(self, move):
        super().__init__()
        self.move = move

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        b, c, h, w = x.size()
        x = self.move(x.view(b, 2, c // 2, h, w)).contiguous().view(b, c, h, w)
        return self.fc(F.max_pool2d(x, 2).view(x.size(0), -1))


class ChannelsLast(Net):
    """x.permute(0, 2, 3, 1), then f, then the permute back."""
    def __init__(self, f):
        super().__init__()
        self.f = f
        self.ln = nn.LayerNorm([28, 4])

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.f(self, x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.fc(F.max_pool2d(x, 2).reshape(x.size(0), -1))


class SharedOther(Net):
    """conv2's weights read again by a convolution with other arguments (dilation 2): not a module
    called twice, which cohort imports."""
    def __init__(self):
        super().__init__()
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.conv2d(self.conv2(x), self.conv2.weight, self.conv2.bias, padding=2, dilation=2)
        return self.fc(F.max_pool2d(x, 2).view(x.size(0), -1))


class Cropped(Net):
    """x[:, :, 1:-1, 1:-1]: a slice of rows and columns, not of channels."""
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4 * 13 * 13, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))[:, :, 1:-1, 1:-1]
        return self.fc(F.max_pool2d(x, 2).view(x.size(0), -1))


class Between(Net):
    """Net with one operation (f) between its ReLU and its pooling, as a user writes it."""
    def __init__(self, f, eps=1e-5):
        super().__init__()
        self.f = f
        self.bn1 = nn.BatchNorm2d(4, eps=eps)

    def forward(self, x):
        x = F.max_pool2d(self.f(F.relu(self.bn1(self.conv1(x)))), 2)
        return self.fc(x.view(x.size(0), -1))


def export(m, path, training=True, opset=13, channels=1, fold=None):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_export(m, torch.zeros(2, channels, 28, 28), path, opset_version=opset,
                          training=torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL,
                          do_constant_folding=(not training) if fold is None else fold, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def edited(src, dst, edit):
    m = onnx.load(src)
    edit(m)
    with open(dst, "wb") as f:
        f.write(m.SerializeToString())


def init(m, name):
    return next(t for t in m.graph.initializer if t.name == name)


def node(m, op):
    return next(n for n in m.graph.node if n.op_type == op)


def main(out):
    os.makedirs(out, exist_ok=True)
    good = os.path.join(out, "good.onnx")
    torch.manual_seed(0)
    export(Net(), good)
    p = lambda name: os.path.join(out, name + ".onnx")  # noqa: E731
    cases = []

    def case(name, needle, edit=None):
        if edit:
            edited(good, p(name), edit)
        cases.append((name, needle))

    raw = open(good, "rb").read()
    open(p("truncated"), "wb").write(raw[: len(raw) // 2])
    case("truncated", "not an ONNX model")
    open(p("empty"), "wb").close()
    case("empty", "not an ONNX model")
    open(p("text"), "wb").write(b"this is not a protobuf, just some text\n" * 10)
    case("text", "not an ONNX model")

    def huge(m):
        t = init(m, "fc.weight")
        del t.dims[:]
        t.dims.extend([1 << 40, 1 << 40])
    case("huge_dims", "dimension 0 is 1099511627776", huge)

    def overflow(m):
        t = init(m, "fc.weight")
        del t.dims[:]
        t.dims.extend([1 << 30] * 4)
    case("overflow_dims", "more than 2^31 elements", overflow)

    def cycle(m):
        relu = node(m, "Relu")
        bn = node(m, "BatchNormalization")
        bn.input[0] = relu.output[0]   # BN reads ReLU's output, and ReLU reads BN's
    case("cycle", "which no earlier node makes", cycle)

    def undefined(m):
        node(m, "Relu").input[0] = "nowhere"
    case("undefined", "reads 'nowhere', which no earlier node makes", undefined)

    def unknown(m):
        relu = node(m, "Relu")
        relu.op_type = "Elu"
        relu.name = "/the_elu"
    case("unknown_op", "node '/the_elu' (Elu): operator 'Elu' is not supported", unknown)

    def custom_domain(m):
        node(m, "Relu").domain = "com.microsoft"
    case("custom_domain", "operator domain 'com.microsoft'", custom_domain)

    def wrong_shape(m):
        t = init(m, "conv1.weight")
        t.CopyFrom(numpy_helper.from_array(np.zeros((4, 1, 5, 5), np.float32), "conv1.weight"))
    case("wrong_shape", "initializer 'conv1.weight' has shape (4, 1, 5, 5); the node needs (4, 1, 3, 3)", wrong_shape)

    def wrong_bias(m):
        t = init(m, "fc.bias")
        t.CopyFrom(numpy_helper.from_array(np.zeros(7, np.float32), "fc.bias"))
    case("wrong_bias", "initializer 'fc.bias' has shape (7); the node needs (10)", wrong_bias)

    def short_data(m):
        t = init(m, "fc.bias")
        t.raw_data = t.raw_data[:8]
    case("short_data", "its shape has 10 elements, its data 2", short_data)

    def nan(m):
        t = init(m, "fc.bias")
        a = numpy_helper.to_array(t).copy()
        a[3] = np.nan
        t.CopyFrom(numpy_helper.from_array(a, "fc.bias"))
    case("nan_weight", "tensor 'fc.bias' holds nan at element 3", nan)

    def external(m):
        t = init(m, "fc.weight")
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value="../../etc/passwd")
    case("external_data", "keeps its data in an external file", external)

    def duplicate(m):
        m.graph.initializer.append(init(m, "fc.bias"))
    case("duplicate_init", "value 'fc.bias' is defined twice", duplicate)

    def two_outputs(m):
        m.graph.output.append(m.graph.output[0])
    case("two_outputs", "outputs; cohort trains one", two_outputs)

    def opset18(m):
        m.opset_import[0].version = 18
    case("opset18", "opset 18: cohort imports opsets 13 to 17", opset18)

    def unused(m):
        m.graph.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "extra.weight"))
    case("unused_init", "initializer 'extra.weight' is read by no node", unused)

    def renamed(m):
        init(m, "conv1.bias").name = "conv2.bias"
        node(m, "Conv").input[2] = "conv2.bias"
    case("renamed", "initializer 'conv2.bias' should be named 'conv1.bias'", renamed)

    def newline_name(m):
        relu = node(m, "Relu")
        relu.op_type = "Gelu"
        relu.name = "evil\nname"
    case("newline_name", "node 'evil?name' (Gelu)", newline_name)

    def strided_pad(m):
        conv = node(m, "Conv")
        for a in conv.attribute:
            if a.name == "pads":
                a.ints[:] = [1, 0, 1, 0]
    case("asymmetric_pads", "cohort supports equal values for height and width", strided_pad)

    export(Net(), p("eval_export"), training=False)
    case("eval_export", "an inference export (initializer 'onnx::Conv_")
    # The hint's call names the input, so that its dynamic axis applies (without input_names the
    # batch stays fixed, and the next error misleads).
    export(Net(), p("eval_export_hint"), training=False)
    case("eval_export_hint", 'input_names=["input"], output_names=["output"], dynamic_axes={"input": {0: "batch"}, '
                             '"output": {0: "batch"}})')
    # Eval mode without folding: BatchNormalization with training_mode 0.
    export(NormAfterRelu(), p("eval_bn"), training=False, opset=15, fold=False)
    case("eval_bn", "node '/bn1/BatchNormalization' (BatchNormalization): an inference export")
    export(FixedBatch(), p("fixed_batch"))
    case("fixed_batch", "reshapes to a batch of 2, fixed when the model was exported")
    export(MidSoftmax(), p("mid_softmax"))
    case("mid_softmax", "only as the model's last operation")

    def constant(m, name, value):
        m.graph.node.insert(0, helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value)))

    def vector_mul(m):
        constant(m, "four", np.ones(4, np.float32))
        relu = node(m, "Relu")
        relu.op_type, relu.name = "Mul", "/scale"
        relu.input.append("four")
    case("vector_mul", "node '/scale' (Mul): input 'four' is a constant of 4 numbers", vector_mul)

    def reciprocal(m):
        constant(m, "one", np.array(1, np.float32))
        relu = node(m, "Relu")
        x = relu.input[0]
        relu.op_type = "Div"
        relu.input[:] = ["one", x]
    case("reciprocal", "a number divided by a tensor", reciprocal)

    def tensor_sub(m):
        relu = node(m, "Relu")
        relu.op_type = "Sub"
        relu.input.append(relu.input[0])
    case("tensor_sub", "Sub of two tensors is not supported", tensor_sub)

    def hardsigmoid(m):
        relu = node(m, "Relu")
        relu.op_type = "HardSigmoid"
        relu.attribute.append(helper.make_attribute("alpha", 0.2))
    case("hardsigmoid_alpha", "only PyTorch's hardsigmoid (alpha 1/6, beta 0.5)", hardsigmoid)

    # Arguments the checkpoint reader (graph.json) would refuse are refused at import: one range
    # table for the builder, the importer and the reader (training with them once exited 0 and left
    # checkpoints nothing could load).
    export(Between(lambda x: x, eps=1e-13), p("bn_eps_tiny"))
    case("bn_eps_tiny", "(batchnorm): eps 1e-13 is not in 1e-12..1")
    export(Between(nn.LeakyReLU(2e6)), p("leaky_slope_huge"))
    case("leaky_slope_huge", "(leaky_relu): negative_slope (as float) 2000000 is not in -1e+06..1e+06")
    export(Between(lambda x: torch.clamp(x, 0, 1e31)), p("clip_huge"))
    case("clip_huge", "(clip): max (as float) 9.99999985e+30 is not in -1e+30..1e+30")
    export(Between(nn.Dropout(0.9999995)), p("dropout_p_huge"))
    case("dropout_p_huge", "(dropout): p 0.999999523 is not in 0..0.999999")
    export(Between(lambda x: x / 1e-30), p("divide_tiny"))
    case("divide_tiny", "(affine): scale (as float) 1.00000002e+30 is not in -1e+30..1e+30")

    def negative_variance(m):
        t = init(m, "bn1.running_var")
        a = numpy_helper.to_array(t).copy()
        a[2] = -0.5
        t.CopyFrom(numpy_helper.from_array(a, "bn1.running_var"))
    case("negative_variance", "tensor 'bn1.running_var' holds a negative variance -0.5 at element 2", negative_variance)

    # Inputs no handler reads are refused, not dropped.
    def conv_five(m):
        conv = node(m, "Conv")
        conv.input.extend([conv.input[1], conv.input[2]])
        conv.name = "/conv1/Conv"
    case("conv_five_inputs", "node '/conv1/Conv' (Conv): 5 inputs; Conv takes at most 3", conv_five)

    def relu_two(m):
        relu = node(m, "Relu")
        relu.input.append(relu.input[0])
        relu.name = "/Relu"
    case("relu_two_inputs", "node '/Relu' (Relu): 2 inputs; Relu takes at most 1", relu_two)

    export(ExpandIntoConv(), p("expand_into_conv"), opset=14)
    case("expand_into_conv", "(Conv): reads '/Expand_output_0', the output of an Expand")
    export(WideExpand(), p("wide_expand"), opset=14)
    case("wide_expand", "an Expand to 4x28x28 is wider than the broadcast of its Add")
    export(ThreeDims(), p("three_dims"), opset=14)
    case("three_dims", "to 3 dimensions: cohort reshapes to (batch, features) or (batch, c, h, w) only")

    export(HalfUnsqueeze(), p("half_unsqueeze"), opset=13)
    case("half_unsqueeze", "(Sigmoid): reads '/Unsqueeze_output_0', a (batch, 4, 1) tensor")

    export(ColourNet(), p("other_data"), channels=3)
    case("other_data", "takes 3x28x28 inputs to 10 logits; the data are 1x28x28")

    # The refusal names the operator that cohort lacks and what in PyTorch made it, not a node
    # downstream or upstream of it.
    export(Upsampled(), p("upsample"), opset=13)
    case("upsample", "(Resize): only modes 'nearest' and 'linear' (bilinear) are imported (bicubic Resize is not yet)")
    export(Shuffled(lambda v: v.transpose(3, 4)), p("group_transpose"), opset=13)
    case("group_transpose", "cohort imports only the channel shuffle's, perm (0, 2, 1, 3, 4)")
    export(Shuffled(lambda v: torch.sigmoid(v)), p("group_read"), opset=13)
    case("group_read", "(Sigmoid): reads '/Reshape_output_0', a (batch, 2, 2, h, w) view into channel groups")
    # A transpose that moves the batch (a channels-last view read by other ops imports: permute_step).
    export(ChannelsLast(lambda s, v: torch.sigmoid(v.transpose(0, 1)).transpose(0, 1)), p("batch_transpose"), opset=17)
    case("batch_transpose", "cohort imports x.permute(0, a, b, c) of a (batch, c, h, w) tensor, the batch first")
    export(ChannelsLast(lambda s, v: s.ln(v)), p("channels_last_wide"), opset=17)
    case("channels_last_wide", "a LayerNorm of a channels-last view over more than its last axis (the channels)")
    export(SharedOther(), p("shared_other_args"), opset=13)
    case("shared_other_args", "reads the weights of node 'conv2' with other arguments")
    export(Cropped(), p("slice_rows"), opset=13)
    case("slice_rows", "only a slice of the channels (axis 1) of a (batch, c, h, w) tensor")

    # Three operators cohort lacks, in one file: all three named at once (onnx_hostile.sh checks
    # the lines), not one per run. Not a case of one line.
    def three(m):
        for op, name, new in (("Relu", "/act/Relu", "Elu"), ("MaxPool", "/up1/MaxPool", "ReduceMax"),
                              ("BatchNormalization", "/norm/BatchNormalization", "InstanceNormalization")):
            n = node(m, op)
            n.op_type, n.name = new, name
    edited(good, p("three_unknown"), three)

    with open(os.path.join(out, "cases"), "w") as f:
        for name, needle in cases:
            f.write(f"{name}\t{needle}\n")


if __name__ == "__main__":
    main(sys.argv[1])
