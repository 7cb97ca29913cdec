"""torch.onnx.export with the TorchScript exporter that the ONNX fixtures are written for.

PyTorch 2.9 and later default to the dynamo exporter, which writes opset 18 whatever opset_version
asks for and renames initializers; dynamo=False keeps the TorchScript one where the argument exists
(older PyTorch, Debian's included, has only that one). A GPU machine's PyTorch is such a later one.
"""
import inspect

import torch


def export(*args, **kwargs):
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs.setdefault("dynamo", False)
    torch.onnx.export(*args, **kwargs)
