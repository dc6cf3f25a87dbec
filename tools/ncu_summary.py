#!/usr/bin/env python3
"""Where a training step's GPU time goes: reads the per-kernel summary that
`ncu --metrics gpu__time_duration.sum --print-summary per-kernel` prints (tools/device_check.sh
runs it over a few steps of train_gpt) and groups the kernels into families.

  tools/ncu_summary.py NCU_OUTPUT --steps N      prints the families as JSON

Each kernel's time is Nsight Compute's: launched alone, clocks locked, caches flushed, so the sum
is above a free-running step; the families' shares are what the output is for. The Philox draws
of the initialisation are reported apart (they are not part of a step)."""
import argparse
import json
import re
import sys

# (family, substrings of the kernel name), first match wins.
FAMILIES = [
    ("initialisation (Philox draws)", ["random_kernel"]),
    ("matmul (cuBLASLt)", ["nvjet", "cublasLt", "gemm", "Gemm", "sm90_xmma", "cutlass"]),
    ("attention", ["attention_"]),
    ("bias add", ["bias_add"]),
    ("bias gradient", ["bias_grad"]),
    ("GELU", ["gelu"]),
    ("layer norm", ["layer_norm"]),
    ("residual add", ["add_op", "sum_value"]),
    ("fill", ["fill_kernel", "fill_op", "memset"]),
    ("optimizer (AdamW, master copies)", ["adamw", "sgd_op", "accumulate_op", "convert_op"]),
    ("gradient norm", ["squared_norm"]),
    ("cross-entropy", ["cross_entropy", "log_sum_exp"]),
    ("embedding", ["token_", "position_", "gather_rows", "embedding", "Radix", "radix"]),
    ("dropout", ["dropout"]),
]

UNITS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
         "s": 1e3, "second": 1e3}

KERNEL = re.compile(r"^\s{2}(\S.*?)\s*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\).*Invocations\s+(\d+)")


def read_kernels(text):
    """[(name, invocations, total milliseconds)] from ncu's per-kernel summary."""
    kernels = []
    name = None
    for line in text.splitlines():
        match = KERNEL.match(line)
        if match:
            name, invocations = match.group(1), int(match.group(2))
            continue
        if name is not None and "gpu__time_duration.sum" in line:
            fields = line.split()
            unit, average = fields[1], float(fields[4].replace(",", ""))
            if unit not in UNITS:
                raise ValueError(f"ncu_summary: unknown time unit '{unit}' in: {line.strip()}")
            kernels.append((name, invocations, average * UNITS[unit] * invocations))
            name = None
    return kernels


def family_of(name):
    for family, keys in FAMILIES:
        if any(key in name for key in keys):
            return family
    return "other"


def summarise(kernels, steps):
    families, init = {}, 0.0
    for name, _, total in kernels:
        family = family_of(name)
        if family.startswith("initialisation"):
            init += total
        else:
            families[family] = families.get(family, 0.0) + total
    per_step = sorted(((f, t / steps) for f, t in families.items()), key=lambda item: -item[1])
    heaviest = sorted(kernels, key=lambda k: -k[2])[:15]
    return {
        "method": "ncu --metrics gpu__time_duration.sum: each kernel alone, clocks locked, "
                  "caches flushed; above a free-running step, shares are the point",
        "steps": steps,
        "step_ms": round(sum(t for _, t in per_step), 2),
        "initialisation_ms": round(init, 2),
        "families": [{"family": f, "ms_per_step": round(t, 2)} for f, t in per_step],
        "heaviest_kernels": [{"kernel": n[:160], "invocations": i, "ms_per_step": round(t / steps, 2)}
                             for n, i, t in heaviest],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ncu_output")
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    kernels = read_kernels(open(args.ncu_output, encoding="utf-8", errors="replace").read())
    if not kernels:
        sys.exit(f"ncu_summary: no kernel summary found in {args.ncu_output}")
    json.dump(summarise(kernels, args.steps), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
