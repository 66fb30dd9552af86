#!/usr/bin/env python3
"""Trains Shardline's GPT in PyTorch, for the peer benchmark (bench/peers/run.sh).

The same model (pre-LayerNorm GPT-2 blocks, tanh GELU, learned positions, an
untied head without bias), the same initial weights (a safetensors file that
shardline-train wrote), the same batches (Shardline's data sources ported
below: SplitMix64 keyed by seed, step and place in the global batch), the
same loss scaling over micro-batches and the same AdamW, learning-rate
schedule and weight-decay groups. Prints one JSON line per step: loss and
step seconds.

  torch_gpt.py SPEC.json --init=INIT.safetensors --steps=N --threads=2 \
      [--attention=fused|eager]

With --pipeline_rank=R (R = 0, 1; --pipeline_store=FILE, the same for both
processes, for the gloo rendezvous) it runs one of the two stages of
torch.distributed.pipelining (spec's micro-batches). --pipeline_schedule=1f1b
(the default) cuts as bench_pipeline cuts: the embedding and the first half
of the blocks on rank 0, the rest and the head on rank 1, which prints the
lines. --pipeline_schedule=zbv runs PyTorch's zero-bubble schedule
(ScheduleZBVZeroBubble), which needs two stages per rank in a V: four chunks
of a quarter of the blocks each (the embedding with the first, the head with
the last), chunks 0 and 3 on rank 0, which then prints the lines, 1 and 2 on
rank 1. Each process gets --threads threads.

Benchmarks only: never run by CI, never at runtime.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def mix_key(a, b, c=0, d=0):
    h = splitmix64(a)
    h = splitmix64(h ^ b)
    h = splitmix64(h ^ c)
    return splitmix64(h ^ d)


class Rng:
    def __init__(self, key):
        self.state = key

    def next(self):
        value = splitmix64(self.state)
        self.state = (self.state + 1) & MASK64
        return value

    def uniform(self, n):
        return (self.next() * n) >> 64

    def uniform_double(self):
        return (self.next() >> 11) * 2.0**-53


class TextBytes:
    """worker/data/token_file_data.cc (text_bytes)"""

    def __init__(self, data, context, seed):
        self.text = open(data["path"], "rb").read()
        self.split = int(len(self.text) * (1.0 - data.get("val_fraction", 0.1)))
        self.context, self.seed = context, seed

    def batch(self, step, micro_batch, sequences):
        ids, targets = [], []
        starts = self.split - self.context
        for s in range(sequences):
            rng = Rng(mix_key(self.seed, 0x7E47, step, micro_batch * sequences + s))
            at = rng.uniform(starts)
            ids.append(list(self.text[at:at + self.context]))
            targets.append(list(self.text[at + 1:at + self.context + 1]))
        return ids, targets


class Addition:
    """worker/data/addition_data.cc"""

    PLUS, EQUALS, END = 10, 11, 12

    def __init__(self, data, seed):
        self.digits = data.get("digits", 2)
        self.holdout = data.get("holdout_fraction", 0.1)
        self.limit = 10**self.digits
        self.seed = seed

    def held_out(self, a, b):
        return Rng(mix_key(self.seed, 0x4E1D0, a * self.limit + b)).uniform_double() < self.holdout

    def encode(self, a, b):
        def digits(value, count, reverse):
            out = [0] * count
            for i in range(count):
                out[i if reverse else count - 1 - i] = value % 10
                value //= 10
            return out
        return (digits(a, self.digits, False) + [self.PLUS] + digits(b, self.digits, False) + [self.EQUALS] +
                digits(a + b, self.digits + 1, True) + [self.END])

    def batch(self, step, micro_batch, sequences):
        t = 3 * self.digits + 3
        first_scored = 2 * self.digits + 1
        ids, targets = [], []
        for s in range(sequences):
            rng = Rng(mix_key(self.seed, 0xDA7A, step, micro_batch * sequences + s))
            while True:
                a, b = rng.uniform(self.limit), rng.uniform(self.limit)
                if not self.held_out(a, b):
                    break
            tokens = self.encode(a, b)
            ids.append(tokens[:t])
            targets.append([tokens[j + 1] if j >= first_scored else -1 for j in range(t)])
        return ids, targets


class Block(torch.nn.Module):
    def __init__(self, c, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1 = torch.nn.LayerNorm(c, eps=1e-5)
        self.qkv = torch.nn.Linear(c, 3 * c)
        self.proj = torch.nn.Linear(c, c)
        self.ln2 = torch.nn.LayerNorm(c, eps=1e-5)
        self.fc = torch.nn.Linear(c, 4 * c)
        self.mlp_proj = torch.nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, d).transpose(1, 2) for z in (q, k, v))
        if self.attention == "fused":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, model, attention):
        super().__init__()
        c, vocab = model["d_model"], model["vocab_size"]
        self.tok_emb = torch.nn.Embedding(vocab, c)
        self.pos_emb = torch.nn.Embedding(model["context"], c)
        self.blocks = torch.nn.ModuleList(Block(c, model["n_heads"], attention) for _ in range(model["n_layers"]))
        self.ln_f = torch.nn.LayerNorm(c, eps=1e-5)
        self.lm_head = torch.nn.Linear(c, vocab, bias=False)

    def forward(self, ids):
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class Chunk(torch.nn.Module):
    """Blocks [begin, end) of the GPT, with the embedding when begin is 0 and
    the head when end is the last block's."""

    def __init__(self, gpt, begin, end):
        super().__init__()
        self.first, self.last = begin == 0, end == len(gpt.blocks)
        if self.first:
            self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb
        self.blocks = torch.nn.ModuleList(gpt.blocks[begin:end])
        if self.last:
            self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head

    def forward(self, x):
        if self.first:
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def learning_rate(opt, step, total):
    """worker/nn/optimizer.cc LearningRate"""
    lr, warmup = opt["lr"], opt.get("warmup_steps", 0)
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    progress = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
    low = lr * opt.get("min_lr_ratio", 0.1)
    return low + 0.5 * (lr - low) * (1.0 + math.cos(math.pi * progress))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--init", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attention", choices=["fused", "eager"], default="fused")
    parser.add_argument("--pipeline_rank", type=int, default=-1)
    parser.add_argument("--pipeline_store", default="")
    parser.add_argument("--pipeline_schedule", choices=["1f1b", "zbv"], default="1f1b")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = json.load(open(args.spec))
    model_spec, train = spec["model"], spec["train"]
    data = spec["data"]
    source = (TextBytes(data, model_spec["context"], train["seed"]) if data["kind"] == "text_bytes"
              else Addition(data, train["seed"]))

    model = Gpt(model_spec, args.attention)
    names = {".attn.qkv.": ".qkv.", ".attn.proj.": ".proj.", ".mlp.fc.": ".fc.", ".mlp.proj.": ".mlp_proj."}
    weights = {}
    for name, tensor in load_file(args.init).items():
        for ours, theirs in names.items():
            name = name.replace(ours, theirs)
        weights[name] = tensor
    model.load_state_dict(weights, strict=True)
    rank = args.pipeline_rank
    schedule = None
    if rank >= 0:
        import torch.distributed as dist  # only the pipeline mode needs them

        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleZBVZeroBubble
        dist.init_process_group("gloo", init_method=f"file://{args.pipeline_store}", rank=rank, world_size=2)
        loss_scale = [1.0]

        def loss_fn(logits, targets):
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1,
                                   reduction="sum") * loss_scale[0]
        layers = model_spec["n_layers"]
        if args.pipeline_schedule == "1f1b":
            half = layers // 2
            model = Chunk(model, 0, half) if rank == 0 else Chunk(model, half, layers)
            stage = PipelineStage(model, rank, 2, torch.device("cpu"))
            schedule = Schedule1F1B(stage, n_microbatches=train["micro_batches"], loss_fn=loss_fn,
                                    scale_grads=False)
        else:
            quarter = layers // 4
            chunks = [0, 3] if rank == 0 else [1, 2]
            modules = [Chunk(model, c * quarter, layers if c == 3 else (c + 1) * quarter) for c in chunks]
            stages = [PipelineStage(m, c, 4, torch.device("cpu")) for m, c in zip(modules, chunks)]
            model = torch.nn.ModuleList(modules)
            schedule = ScheduleZBVZeroBubble(stages, n_microbatches=train["micro_batches"], loss_fn=loss_fn,
                                             scale_grads=False)
    opt = train["optimizer"]
    decay = [p for n, p in model.named_parameters() if n.endswith(".weight") and p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith(".weight") and p.dim() == 2)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": opt.get("weight_decay", 0.1)},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=opt["lr"], betas=(opt.get("beta1", 0.9), opt.get("beta2", 0.95)),
                                  eps=opt.get("eps", 1e-8))
    micro_batches = train["micro_batches"]
    per_micro = train["global_batch"] // micro_batches
    # The process with the head reports: rank 1 under 1F1B, rank 0 under ZBV.
    reports = rank < 0 or rank == (1 if args.pipeline_schedule == "1f1b" else 0)
    if reports:
        print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                          "mkl": torch.backends.mkl.is_available(), "attention": args.attention,
                          "pipeline": rank >= 0}), flush=True)
    for step in range(1, args.steps + 1):
        batches = [source.batch(step, k, per_micro) for k in range(micro_batches)]
        batches = [(torch.tensor(i, dtype=torch.long), torch.tensor(t, dtype=torch.long)) for i, t in batches]
        start = time.perf_counter()
        scale = 1.0 / sum(int((t >= 0).sum()) for _, t in batches)
        optimizer.zero_grad(set_to_none=False)
        loss_sum = 0.0
        if schedule is not None:
            loss_scale[0] = scale
            ids = torch.cat([i for i, _ in batches])
            targets = torch.cat([t for _, t in batches])
            losses = []
            if args.pipeline_schedule == "1f1b":
                if rank == 0:
                    schedule.step(ids)
                else:
                    schedule.step(target=targets, losses=losses)
            elif rank == 0:  # the V's first and last stages
                schedule.step(ids, target=targets, losses=losses)
            else:
                schedule.step()
            loss_sum = sum(loss.item() for loss in losses)
        else:
            for ids, targets in batches:
                logits = model(ids)
                loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1,
                                       reduction="sum") * scale
                loss.backward()
                loss_sum += loss.item()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(opt, step, train["steps"])
        optimizer.step()
        seconds = time.perf_counter() - start
        if not reports:
            continue
        print(json.dumps({"step": step, "loss": loss_sum, "seconds": seconds,
                          "tokens": sum(i.numel() for i, _ in batches)}), flush=True)


if __name__ == "__main__":
    main()
