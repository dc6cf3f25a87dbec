#!/usr/bin/env python3
"""The JSON summary of tools/device_check.sh: the GPU tests' results, the benchmarks' figures
against issue 14's targets, the training run's tokens/s and MFU where it ran, the 124M step's
kernel families (tools/ncu_summary.py) where Nsight Compute profiled it, the samples generated
on the GPU, and BPipe against 1F1B at p = 6 on the host cores (bench_pipeline_runtime's p6 rows),
DualPipeV's overlapped pairs against pairs in sequence there (its dualpipe_v_moe rows)
where they ran."""
import argparse
import json
import os
import sys

TARGETS = {"memory_fraction_of_copy": 0.80, "matmul_ratio_to_cublaslt": 0.97, "gpt2_124m_mfu": 0.45}


def read_tests(out):
    tests = []
    path = os.path.join(out, "tests.txt")
    if os.path.exists(path):
        for line in open(path):
            parts = line.split(maxsplit=2)
            if len(parts) >= 2:
                tests.append({"binary": parts[0], "exit_code": int(parts[1]),
                              "result": parts[2].strip() if len(parts) > 2 else ""})
    return tests


def read_benchmarks(out):
    path = os.path.join(out, "bench_gpu_kernels.json")
    if not os.path.exists(path):
        return None
    return json.load(open(path))["benchmarks"]


def summarise(benchmarks):
    summary = {"copy_GBps": None, "memory_bound": [], "matmul": [], "attention": []}
    for b in benchmarks:
        name = b["name"]
        if "error_message" in b:
            summary.setdefault("errors", []).append({"name": name, "error": b["error_message"]})
            continue
        if name.startswith("copy_bandwidth"):
            summary["copy_GBps"] = round(b["GB/s"], 1)
        elif "copy_GB/s" in b:
            fraction = b["fraction"]
            summary["memory_bound"].append({
                "name": name, "GBps": round(b["GB/s"], 1), "copy_GBps": round(b["copy_GB/s"], 1),
                "fraction_of_copy": round(fraction, 3),
                "target": TARGETS["memory_fraction_of_copy"],
                "met": fraction >= TARGETS["memory_fraction_of_copy"]})
        elif name.startswith("matmul"):
            summary["matmul"].append({
                "name": name, "TFLOPs": round(b["TFLOP/s"], 1),
                "cublaslt_TFLOPs": round(b["cublaslt_TFLOP/s"], 1), "ratio": round(b["ratio"], 3),
                "target": TARGETS["matmul_ratio_to_cublaslt"],
                "met": b["ratio"] >= TARGETS["matmul_ratio_to_cublaslt"]})
        elif name.startswith("attention"):
            summary["attention"].append({"name": name, "TFLOPs": round(b["TFLOP/s"], 1)})
    return summary


def read_training(out, name, mfu_target):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return "not run"
    report = json.load(open(path))
    throughput = report["throughput"]
    summary = {"final_loss": report.get("final_loss"),
               "entropy_floor": report.get("data", {}).get("entropy_floor"),
               "parameters": throughput["parameters"],
               "peak": throughput["peak_source"],
               "tokens_per_second": round(throughput.get("steady_tokens_per_second",
                                                         throughput["tokens_per_second"])),
               "mfu": round(throughput.get("steady_mfu", throughput["mfu"]), 4)}
    if mfu_target is not None:
        summary["mfu_target"] = mfu_target
        summary["met"] = summary["mfu"] >= mfu_target
    return summary


def read_samples(out, name):
    """The samples of a run that generated on the GPU: each one's step, text and the share of
    its transitions the Markov source allows (1.0 for a model that learned the chain)."""
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return "not run"
    samples = json.load(open(path)).get("samples", [])
    if not samples:
        return "no samples"
    return [{"step": s["step"], "text": s["text"],
             "allowed_share": (round(s["allowed_transitions"] / len(s["tokens"]), 3)
                               if "allowed_transitions" in s and s["tokens"] else None)}
            for s in samples]


def read_pipeline(out, pairs):
    """The p6 rows (pairs False): the measured step, the simulator's, their ratio and both idle
    shares. The dualpipe_v_moe rows (pairs True): the step overlapped and in sequence, their ratio,
    the mean pair both ways and the hand-overs per step."""
    path = os.path.join(out, "bench_pipeline_runtime.json")
    if not os.path.exists(path):
        return "not run"
    try:
        benchmarks = json.load(open(path))["benchmarks"]
    except (ValueError, KeyError):
        return "unreadable (the benchmark stopped mid-run?)"
    rows = []
    for b in benchmarks:
        if ("dualpipe_v_moe" in b["name"]) != pairs:
            continue
        if "error_message" in b:
            rows.append({"name": b["name"], "error": b["error_message"]})
        elif pairs:
            rows.append({"name": b["name"], "step_ms": round(b["real_time"], 2),
                         "sequential_ms": round(b["sequential_ms"], 2),
                         "overlapped_over_sequential": round(b["overlapped_over_sequential"], 3),
                         "pair_ms_overlapped": round(b["pair_ms_overlapped"], 3),
                         "pair_ms_sequential": round(b["pair_ms_sequential"], 3),
                         "hand_overs_per_step": b["hand_overs_per_step"]})
        else:
            rows.append({"name": b["name"], "step_ms": round(b["real_time"], 2),
                         "simulated_ms": round(b["simulated_ms"], 2),
                         "measured_over_simulated": round(b["measured_over_simulated"], 3),
                         "bubble_measured": round(b["bubble_measured"], 3),
                         "bubble_simulated": round(b["bubble_simulated"], 3)})
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--seconds", type=int, default=0)
    parser.add_argument("--status", type=int, default=0)
    args = parser.parse_args()
    gpu = open(os.path.join(args.out, "gpu.txt")).read().strip().splitlines()
    result = {"gpu": gpu[-1] if gpu else "unknown", "seconds": args.seconds,
              "status": "pass" if args.status == 0 else "fail", "tests": read_tests(args.out)}
    benchmarks = read_benchmarks(args.out)
    if benchmarks is None:
        result["benchmarks"] = "not run"
    else:
        result.update(summarise(benchmarks))
    result["train_gpt_default"] = read_training(args.out, "train_gpt_default.json", None)
    result["train_gpt_moe"] = read_training(args.out, "train_gpt_moe.json", None)
    result["samples_serial"] = read_samples(args.out, "train_gpt_sample.json")
    result["samples_ep"] = read_samples(args.out, "train_gpt_sample_ep.json")
    result["samples_pp"] = read_samples(args.out, "train_gpt_sample_pp.json")
    result["train_gpt_124m_bf16"] = read_training(args.out, "train_gpt_report.json",
                                                  TARGETS["gpt2_124m_mfu"])
    profile = os.path.join(args.out, "profile.json")
    result["step_profile"] = json.load(open(profile)) if os.path.exists(profile) else "not run"
    result["pipeline_p6_host"] = read_pipeline(args.out, False)
    result["pipeline_pairs_host"] = read_pipeline(args.out, True)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
