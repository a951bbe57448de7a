#!/usr/bin/python3
"""torch.optim.Adam on one tensor of N parameters (default 100M), 2 threads:
median step time and bytes/s at 28 bytes per parameter, as adam_bench.cc counts."""
import argparse
import json
import statistics
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--parameters", type=int, default=100_000_000)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--repeats", type=int, default=7)
args = parser.parse_args()
torch.set_num_threads(args.threads)
p = torch.nn.Parameter(torch.rand(args.parameters) * 2 - 1)
p.grad = torch.rand(args.parameters) * 2 - 1
opt = torch.optim.Adam([p], lr=1e-3)
opt.step()
times = []
for _ in range(args.repeats):
    start = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - start)
t = statistics.median(times)
print(json.dumps({"kernel": "adam", "impl": "torch.optim.Adam", "parameters": args.parameters,
                  "seconds": round(t, 5), "bytes_per_second": 28.0 * args.parameters / t}))
