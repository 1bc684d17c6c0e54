#!/usr/bin/env python3
"""Copies the recurrent cases of the `layers` fixture suite (nn.LSTM, GRU, RNN
and their cells) into tests/fixtures/layers_recurrent/, so a fresh clone runs
tests/layers_recurrent.rs without ../shared/fixtures.

    python3 scripts/extract-layers-recurrent.py [SHARED_FIXTURES_DIR]

Writes `manifest.json` (the recurrent cases, unchanged) and `layers.safetensors`
(only their tensors, bytes unchanged). Pure Python: a safetensors file is an
8-byte little-endian header length, a JSON header and the raw data.
"""
import json
import os
import struct
import sys

RECURRENT = {"torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN",
             "torch.nn.LSTMCell", "torch.nn.GRUCell", "torch.nn.RNNCell"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], data[a:b])
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        dtype, shape, blob = tensors[k]
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(tmp, path)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "../../shared/fixtures")
    dst = os.path.join(here, "../tests/fixtures/layers_recurrent")
    os.makedirs(dst, exist_ok=True)
    manifest = json.load(open(os.path.join(src, "manifest.json")))
    cases = [c for c in manifest["cases"] if c["suite"] == "layers" and c["op"] in RECURRENT]
    stored = read_safetensors(os.path.join(src, "layers.safetensors"))
    keep = {k: v for k, v in stored.items() if k.split("/", 1)[0] in {c["case"] for c in cases}}
    write_safetensors(os.path.join(dst, "layers.safetensors"), keep)
    out = {k: v for k, v in manifest.items() if k != "cases"}
    out["cases"] = cases
    tmp = os.path.join(dst, "manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(dst, "manifest.json"))
    print(f"{len(cases)} cases, {len(keep)} tensors -> {dst}")


if __name__ == "__main__":
    main()
