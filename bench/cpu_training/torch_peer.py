#!/usr/bin/python3
"""The PyTorch peer of train_throughput.cc: the same mlp, cnn and gpt, the same
batch sizes, Adam, fixed synthetic batches, 2 threads. Prints one JSON object per
model (--precision=bf16: under torch.autocast with bfloat16; --precision=fp16 on
a GPU: autocast with float16 and a GradScaler). Run with Debian's python3-torch (and libopenblas0-pthread installed, or
its matrix products use the reference BLAS).

With --device=cuda it is the GPU peer of bench/gpu/run.py (gpu_only): the same
models on the GPU, TF32 matmuls and convolutions on as Tandem's cuBLAS path has
them, timed with the device synchronised."""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                         nn.ReLU(), nn.Linear(1024, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, 10))


class Block(nn.Module):
    """Pre-norm GPT-2 block, as runtime/layers/blocks.h."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        hs = C // self.heads
        q = q.view(B, T, self.heads, hs).transpose(1, 2)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab=256, d=256, layers=4, heads=4, context=128):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def bench(name, args):
    torch.manual_seed(0)
    device = torch.device(args.device)
    if name == "gpt":
        T = args.gpt_context
        model = Gpt(d=args.gpt_d_model, layers=args.gpt_layers, heads=args.gpt_heads, context=T)
        batch = args.gpt_batch
        x = torch.randint(0, 256, (batch, T))
        y = torch.randint(0, 256, (batch, T))
        loss_fn = lambda out: F.cross_entropy(out.view(-1, 256), y.view(-1))
    else:
        model, batch = (mlp() if name == "mlp" else cnn()), args.image_batch
        x = torch.rand(batch, 1, 28, 28)
        y = torch.randint(0, 10, (batch,))
        loss_fn = lambda out: F.cross_entropy(out, y)
    model, x, y = model.to(device), x.to(device), y.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seconds = args.seconds

    autocast = args.precision in ("bf16", "fp16")
    half = torch.float16 if args.precision == "fp16" else torch.bfloat16
    # fp16: GradScaler's dynamic loss scaling, as a PyTorch user writes it.
    scaler = torch.cuda.amp.GradScaler(enabled=args.precision == "fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        # bf16 / fp16: autocast's matrix products and convolutions in the
        # 16-bit type, the parameters, optimizer and loss in fp32 (what a
        # PyTorch user writes).
        with torch.autocast(device.type, dtype=half, enabled=autocast):
            loss = loss_fn(model(x))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(3):
        step()
    sync()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps < 3:
        step()
        steps += 1
        if steps % 10 == 0:
            sync()
    sync()
    step_seconds = (time.perf_counter() - start) / steps
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": name, "impl": "pytorch", "precision": args.precision,
                      "device": args.device, "batch": batch,
                      "steps": steps,
                      "step_ms": round(1e3 * step_seconds, 3),
                      "samples_per_second": round(batch / step_seconds, 1),
                      "parameters": params}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,cnn,gpt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU peer")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="bf16: torch.autocast(dtype=torch.bfloat16); fp16 (GPUs): "
                             "torch.autocast(dtype=torch.float16) with a GradScaler")
    parser.add_argument("--gpt_layers", type=int, default=4)
    parser.add_argument("--gpt_heads", type=int, default=4)
    parser.add_argument("--gpt_d_model", type=int, default=256)
    parser.add_argument("--gpt_context", type=int, default=128)
    parser.add_argument("--gpt_batch", type=int, default=16)
    parser.add_argument("--image_batch", type=int, default=128, help="mlp and cnn batch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    for name in args.models.split(","):
        bench(name, args)


if __name__ == "__main__":
    main()
