"""Damage or rename the tensors of a safetensors file, for the checkpoint error tests.
Reads and writes the format directly (8-byte length, JSON header, data) with the standard library.

usage: st_edit.py IN OUT prefix PREFIX | drop NAME | dtype NAME DTYPE | shape NAME D0,D1,.. |
       set NAME VALUE (its first float32 element: a number, nan or inf)
"""
import json
import struct
import sys


def main():
    src, dst, op, *args = sys.argv[1:]
    with open(src, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    if op == "prefix":
        header = {args[0] + k: v for k, v in header.items()}
    elif op == "drop":
        # Drop the tensor and its bytes, shifting the others: a valid file without it.
        gone = header.pop(args[0])
        b, e = gone["data_offsets"]
        data = data[:b] + data[e:]
        for v in header.values():
            if v["data_offsets"][0] >= e:
                v["data_offsets"] = [v["data_offsets"][0] - (e - b), v["data_offsets"][1] - (e - b)]
    elif op == "dtype":
        header[args[0]]["dtype"] = args[1]
    elif op == "shape":
        header[args[0]]["shape"] = [int(x) for x in args[1].split(",")]
    elif op == "set":
        b = header[args[0]]["data_offsets"][0]
        data = data[:b] + struct.pack("<f", float(args[1])) + data[b + 4:]
    else:
        sys.exit(f"st_edit: unknown operation {op}")
    if meta is not None:
        header["__metadata__"] = meta
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


if __name__ == "__main__":
    main()
