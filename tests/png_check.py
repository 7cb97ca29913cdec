"""Decode a PNG (8-bit RGB or RGBA, as rsvg-convert writes) with the standard library and check it
is a chart, not a blank page: enough non-white pixels, and pixels near each given colour.

usage: png_check.py FILE.png [RRGGBB ...]
"""
import struct
import sys
import zlib


def decode(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG")
    pos, idat, width = 8, b"", None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            if depth != 8 or ctype not in (2, 6):
                sys.exit(f"{path}: colour type {ctype} depth {depth} not handled")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def main():
    width, height, bpp, rows = decode(sys.argv[1])
    pixels = [tuple(r[x * bpp:x * bpp + 3]) for r in rows for x in range(width)]
    ink = sum(1 for p in pixels if min(p) < 200)
    ok = ink > 0.01 * len(pixels)
    print(f"{sys.argv[1]}: {width}x{height}, {ink} non-white pixels ({100 * ink / len(pixels):.1f}%)")
    for hexc in sys.argv[2:]:
        want = tuple(int(hexc[i:i + 2], 16) for i in (0, 2, 4))
        near = sum(1 for p in pixels if sum(abs(p[i] - want[i]) for i in range(3)) < 60)
        print(f"  colour #{hexc}: {near} pixels")
        ok = ok and near > 50
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
