#!/usr/bin/env python3
"""Converts GPT-2 weights in Hugging Face's layout to Shardline's.

Shardline's GPT is GPT-2's architecture (pre-LayerNorm blocks, eps 1e-5,
tanh GELU, learned positions), with its own names and torch's [out, in]
matrices where GPT-2's Conv1D keeps [in, out]. This reads a safetensors file
of a GPT2Model or GPT2LMHeadModel (keys with or without "transformer."; F32,
F16 or BF16) and writes the f32 weights a job starts from:

    /opt/shardline/pytools/bin/python tools/convert_gpt2.py model.safetensors \\
        gpt2-shardline.safetensors --context 256
    shardctl submit spec.json --init_weights=gpt2-shardline.safetensors

with spec.json's model as the tool prints it ({"vocab_size": 50257,
"context": 256, "d_model": 768, "n_heads": 12, "n_layers": 12} for the 124M
model) and data of GPT-2's token ids ("kind": "tokens"). The head
starts as the token embedding (GPT-2 ties them; Shardline trains them
apart). --context keeps the first positions; --vocab_size pads the
vocabulary with zero rows (e.g. 50304, a multiple of 64).

A tool, run by hand: the product never runs Python.
"""
import argparse
import json
import struct
import sys

import numpy as np
from safetensors.numpy import save_file

DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    """All tensors as float32 numpy arrays (BF16 widened by its bits)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if entry["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32)
        elif entry["dtype"] in DTYPES:
            values = np.frombuffer(raw, dtype=np.dtype(DTYPES[entry["dtype"]]).newbyteorder("<"))
        else:
            continue  # e.g. the bool/uint8 causal-mask buffers some exports keep
        out[name] = values.astype(np.float32).reshape(entry["shape"])
    return out


def convert(hf, context=None, vocab_size=None):
    """Shardline's tensors and the model spec they fit."""
    hf = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in hf.items()}
    for needed in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
        if needed not in hf:
            sys.exit(f"error: no {needed}: not GPT-2 weights in Hugging Face's layout")
    wte, wpe = hf["wte.weight"], hf["wpe.weight"]
    vocab, width = wte.shape
    layers = 0
    while f"h.{layers}.ln_1.weight" in hf:
        layers += 1
    if layers == 0:
        sys.exit("error: no blocks (h.0.ln_1.weight)")
    context = context or wpe.shape[0]
    if context > wpe.shape[0]:
        sys.exit(f"error: --context {context} is longer than the {wpe.shape[0]} positions the weights have")
    vocab_size = vocab_size or vocab
    if vocab_size < vocab:
        sys.exit(f"error: --vocab_size {vocab_size} is smaller than the weights' {vocab}")
    def padded(rows):
        out = np.zeros((vocab_size, width), dtype=np.float32)
        out[:vocab] = rows
        return out

    out = {
        "tok_emb.weight": padded(wte),
        "pos_emb.weight": wpe[:context],
        "ln_f.weight": hf["ln_f.weight"],
        "ln_f.bias": hf["ln_f.bias"],
        "lm_head.weight": padded(hf.get("lm_head.weight", wte)),
    }
    # GPT-2's Conv1D weights are [in, out]: Shardline's are [out, in].
    names = {
        "ln_1.weight": ("ln1.weight", False), "ln_1.bias": ("ln1.bias", False),
        "attn.c_attn.weight": ("attn.qkv.weight", True), "attn.c_attn.bias": ("attn.qkv.bias", False),
        "attn.c_proj.weight": ("attn.proj.weight", True), "attn.c_proj.bias": ("attn.proj.bias", False),
        "ln_2.weight": ("ln2.weight", False), "ln_2.bias": ("ln2.bias", False),
        "mlp.c_fc.weight": ("mlp.fc.weight", True), "mlp.c_fc.bias": ("mlp.fc.bias", False),
        "mlp.c_proj.weight": ("mlp.proj.weight", True), "mlp.c_proj.bias": ("mlp.proj.bias", False),
    }
    for i in range(layers):
        for theirs, (ours, transpose) in names.items():
            key = f"h.{i}.{theirs}"
            if key not in hf:
                sys.exit(f"error: no {key}")
            value = hf[key]
            out[f"blocks.{i}.{ours}"] = value.T if transpose else value
    out = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
    # Every GPT-2 size has heads of 64 (12 of them at 768 wide, 25 at 1600).
    heads = width // 64 if width % 64 == 0 else None
    return out, {"kind": "gpt", "vocab_size": vocab_size, "context": context, "d_model": width, "n_heads": heads,
                 "n_layers": layers}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="GPT-2 weights (safetensors, Hugging Face's layout)")
    parser.add_argument("target", help="where to write Shardline's weights")
    parser.add_argument("--context", type=int, help="positions to keep (default: all)")
    parser.add_argument("--vocab_size", type=int, help="rows of the vocabulary, padded with zeros (default: as is)")
    args = parser.parse_args()
    tensors, model = convert(read_safetensors(args.source), args.context, args.vocab_size)
    save_file(tensors, args.target, metadata={"converted_from": "gpt2"})
    print(f"wrote {len(tensors)} tensors to {args.target}; the spec's model (n_heads: GPT-2's heads of 64):")
    print(json.dumps({"model": model}))


if __name__ == "__main__":
    main()
