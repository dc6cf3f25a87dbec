#!/usr/bin/env python3
"""Compare two train_gpt --report files step by step: every step's loss within a relative
tolerance (default 1e-4, as examples/compare_train_reports.cmake). Prints the largest difference;
exit status 0 when every step agrees, 1 otherwise (or when the step counts differ).

    tools/compare_train_reports.py serial.json parallel.json [--tolerance 1e-4]
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference")
    parser.add_argument("candidate")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    reference = json.load(open(args.reference))["loss"]
    candidate = json.load(open(args.candidate))["loss"]
    if len(reference) != len(candidate) or not reference:
        print(f"{len(reference)} reference losses, {len(candidate)} candidate losses")
        return 1
    worst_step, worst = max(
        ((step, abs(a - b) / abs(a)) for step, (a, b) in enumerate(zip(reference, candidate))),
        key=lambda pair: pair[1])
    agrees = worst <= args.tolerance
    print(f"{len(reference)} steps, largest relative difference {worst:.2e} at step {worst_step} "
          f"({'within' if agrees else 'over'} {args.tolerance:g})")
    return 0 if agrees else 1


if __name__ == "__main__":
    sys.exit(main())
