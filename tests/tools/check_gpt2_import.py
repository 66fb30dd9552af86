"""tools/convert_gpt2.py against GPT-2 itself: random weights in Hugging
Face's GPT-2 layout, converted, give shardline-train (--eval_weights) the
validation loss that an independent float64 numpy GPT-2 (Hugging Face's
layout and names, tied head) computes on the same windows of a tokens file;
and the converted file starts a job (--init_weights).

Two sources: GPT2Model's names in F32 with causal-mask buffers, and
GPT2LMHeadModel's ("transformer." prefix) in F16 with a head of its own.

Usage: check_gpt2_import.py SHARDLINE_TRAIN CONVERT_GPT2_PY WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

VOCAB, POSITIONS, WIDTH, HEADS, LAYERS = 300, 32, 128, 2, 2  # heads of 64, as GPT-2
CONTEXT, EVAL_WINDOWS = 16, 12


def random_gpt2(rng):
    w = {"wte.weight": rng.normal(0, 0.3, (VOCAB, WIDTH)), "wpe.weight": rng.normal(0, 0.1, (POSITIONS, WIDTH)),
         "ln_f.weight": 1 + rng.normal(0, 0.1, WIDTH), "ln_f.bias": rng.normal(0, 0.1, WIDTH)}
    for i in range(LAYERS):
        p = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"] = 1 + rng.normal(0, 0.1, WIDTH)
            w[p + ln + ".bias"] = rng.normal(0, 0.1, WIDTH)
        for name, shape in (("attn.c_attn", (WIDTH, 3 * WIDTH)), ("attn.c_proj", (WIDTH, WIDTH)),
                            ("mlp.c_fc", (WIDTH, 4 * WIDTH)), ("mlp.c_proj", (4 * WIDTH, WIDTH))):
            w[p + name + ".weight"] = rng.normal(0, 0.2, shape)
            w[p + name + ".bias"] = rng.normal(0, 0.1, shape[1])
    return {k: v.astype(np.float32) for k, v in w.items()}


def layer_norm(x, weight, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * weight + bias


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_loss(w, ids, targets, head):
    """Mean cross-entropy of GPT-2 (float64) over one window."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t = len(ids)
    hd = WIDTH // HEADS
    x = w["wte.weight"][ids] + w["wpe.weight"][:t]
    mask = np.triu(np.ones((t, t), dtype=bool), 1)
    for i in range(LAYERS):
        p = f"h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, j * WIDTH:(j + 1) * WIDTH].reshape(t, HEADS, hd).transpose(1, 0, 2) for j in range(3))
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        scores[:, mask] = -np.inf
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        att = scores / scores.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(t, WIDTH)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        x = x + gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]) @ w[p + "mlp.c_proj.weight"] \
            + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"])
    logits = x @ head.astype(np.float64).T
    top = logits.max(-1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
    return float(np.mean(log_z - logits[np.arange(t), targets]))


def main():
    train_bin, convert_py, workdir = sys.argv[1:4]
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, VOCAB, 4000).astype(np.uint16)
    tokens[:3000].tofile(os.path.join(workdir, "train.bin"))
    val = tokens[3000:]
    val.tofile(os.path.join(workdir, "val.bin"))
    spec = {"name": "gpt2-import",
            "model": {"kind": "gpt", "vocab_size": VOCAB, "context": CONTEXT, "d_model": WIDTH, "n_heads": HEADS,
                      "n_layers": LAYERS},
            "data": {"kind": "tokens", "path": os.path.join(workdir, "train.bin"),
                     "val_path": os.path.join(workdir, "val.bin")},
            "train": {"steps": 2, "global_batch": 4, "micro_batches": 1, "seed": 1, "eval_examples": EVAL_WINDOWS,
                      "optimizer": {"kind": "adamw", "lr": 0.001}}}
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)

    base = random_gpt2(rng)
    own_head = rng.normal(0, 0.3, (VOCAB, WIDTH)).astype(np.float32)
    cases = [
        # GPT2Model: no prefix, F32, with the causal-mask buffers; the head is wte.
        ("model", {**base, **{f"h.{i}.attn.bias": np.ones((1, 1, POSITIONS, POSITIONS), dtype=np.uint8)
                              for i in range(LAYERS)}}, None),
        # GPT2LMHeadModel: "transformer." prefix, F16, a head of its own.
        ("lm_head", {**{"transformer." + k: v.astype(np.float16) for k, v in base.items()},
                     "lm_head.weight": own_head.astype(np.float16)}, own_head),
    ]
    for name, source, head in cases:
        source_path = os.path.join(workdir, f"{name}.hf.safetensors")
        save_file(source, source_path)
        converted = os.path.join(workdir, f"{name}.safetensors")
        printed = subprocess.run([sys.executable, convert_py, source_path, converted, "--context", str(CONTEXT)],
                                 check=True, capture_output=True, text=True).stdout
        model = json.loads(printed.strip().splitlines()[-1])["model"]
        assert model == spec["model"], (name, model)

        metrics = os.path.join(workdir, f"{name}.jsonl")
        subprocess.run([train_bin, spec_path, "--threads=1", f"--eval_weights={converted}", f"--metrics_out={metrics}"],
                       check=True, capture_output=True, timeout=60)
        with open(metrics) as f:
            record = [json.loads(line) for line in f if line.strip()][-1]
        assert record["eval"] and record["examples"] == EVAL_WINDOWS, record
        assert "bits_per_byte" not in record, record

        # The reference on the weights as the file held them (F16 rounded).
        weights = {k.removeprefix("transformer."): v.astype(np.float32) for k, v in source.items()
                   if v.dtype != np.uint8}
        ref_head = weights["wte.weight"] if head is None else head.astype(np.float16).astype(np.float32)
        losses = [gpt2_loss(weights, val[o:o + CONTEXT].astype(np.int64), val[o + 1:o + CONTEXT + 1].astype(np.int64),
                            ref_head)
                  for o in range(0, CONTEXT * EVAL_WINDOWS, CONTEXT)]
        want = float(np.mean(losses))
        got = record["val_loss"]
        assert abs(got - want) <= 1e-4 * abs(want), f"{name}: shardline {got} vs numpy GPT-2 {want}"
        assert want > 1.0, want  # a real loss, not a degenerate one
        print(f"{name}: validation loss {got:.6f}, numpy GPT-2 {want:.6f}")

        # And a job starts from it.
        subprocess.run([train_bin, spec_path, "--threads=1", f"--init_weights={converted}",
                        f"--out={os.path.join(workdir, name + '.trained.safetensors')}",
                        f"--metrics_out={os.path.join(workdir, name + '.train.jsonl')}"],
                       check=True, capture_output=True, timeout=60)

    # A file that is not GPT-2's is refused, saying why.
    save_file({"w": np.zeros(3, dtype=np.float32)}, os.path.join(workdir, "other.safetensors"))
    refused = subprocess.run([sys.executable, convert_py, os.path.join(workdir, "other.safetensors"),
                              os.path.join(workdir, "x.safetensors")], capture_output=True, text=True)
    assert refused.returncode != 0 and "not GPT-2 weights" in refused.stderr, refused.stderr
    print("ok")


if __name__ == "__main__":
    main()
