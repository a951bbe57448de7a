#!/usr/bin/python3
"""PyTorch on the recipe of clients/examples/fmnist-{mlp,cnn}.yaml: the same model,
Adam 1e-3, batch 128, a shuffled order every epoch (DataLoader semantics, last
batch partial), pixels scaled to [0, 1]. Prints test accuracy after each epoch as
JSON lines. Reads Debian's IDX files directly (no torchvision)."""
import argparse
import gzip
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cpu_training"))
import torch_peer  # noqa: E402  (the same model definitions as the throughput peer)

ROOT = "/usr/share/datasets/fashion-mnist/"


def idx(name):
    with gzip.open(ROOT + name) as f:
        data = f.read()
    ndims = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims).reshape(dims)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x = torch.from_numpy(idx("train-images-idx3-ubyte.gz").astype(np.float32) / 255).unsqueeze(1)
    y = torch.from_numpy(idx("train-labels-idx1-ubyte.gz").astype(np.int64))
    tx = torch.from_numpy(idx("t10k-images-idx3-ubyte.gz").astype(np.float32) / 255).unsqueeze(1)
    ty = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz").astype(np.int64))
    model = torch_peer.mlp() if args.model == "mlp" else torch_peer.cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128,
                                         shuffle=True)
    for epoch in range(1, args.epochs + 1):
        model.train()
        for bx, by in loader:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(bx), by).backward()
            opt.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(tx), 1000):
                correct += (model(tx[i:i + 1000]).argmax(1) == ty[i:i + 1000]).sum().item()
        print(json.dumps({"impl": "pytorch", "model": args.model, "epoch": epoch,
                          "accuracy": correct / len(tx)}), flush=True)


if __name__ == "__main__":
    main()
