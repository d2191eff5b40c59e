"""Writes a bf16 problem for `gdn op` (safetensors, by hand: numpy only) and compares two of its
output files. Used by bench/gpu_check.sh's cp stage:

  python3 bench/make_op_input.py write IN.safetensors T [--varlen]
  python3 bench/make_op_input.py compare A.safetensors B.safetensors
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "I64": np.int64, "BF16": np.uint16}


def bf16(x):
    """float32 -> bf16 bits, rounded to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, array = tensors[name]
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def main():
    if sys.argv[1] == "write":
        path, T = sys.argv[2], int(sys.argv[3])
        rng = np.random.default_rng(7)
        HK, HV, D = 16, 32, 128
        seqlens = [T // 4 + 100, T // 8 - 37, T - T // 4 - 100 - T // 8 + 37] \
            if "--varlen" in sys.argv else None
        N = len(seqlens) if seqlens else 1
        t = {
            "q": ("BF16", bf16(rng.standard_normal((1, T, HK, D)))),
            "k": ("BF16", bf16(rng.standard_normal((1, T, HK, D)))),
            "v": ("BF16", bf16(rng.standard_normal((1, T, HV, D)))),
            "g": ("F32", -np.exp(rng.normal(-3, 1, (1, T, HV))).astype(np.float32)),
            "beta": ("F32", rng.uniform(0, 1, (1, T, HV)).astype(np.float32)),
            "initial_state": ("F32", (0.1 * rng.standard_normal((N, HV, D, D))).astype(np.float32)),
            "do": ("BF16", bf16(rng.standard_normal((1, T, HV, D)))),
            "dht": ("F32", (0.1 * rng.standard_normal((N, HV, D, D))).astype(np.float32)),
        }
        if seqlens:
            t["cu_seqlens"] = ("I64", np.cumsum([0] + seqlens).astype(np.int64))
        write(path, t)
    else:
        a, b = read(sys.argv[2]), read(sys.argv[3])
        worst = 0.0
        for name in sorted(a):
            x, y = a[name].astype(np.float64), b[name].astype(np.float64)
            err = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)
            worst = max(worst, err)
            print(f"  {name:<12} {err:.2e}")
        print(f"  max          {worst:.2e}")
        sys.exit(0 if worst <= 2e-2 else 1)


if __name__ == "__main__":
    main()
