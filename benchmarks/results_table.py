"""Print a results file (runs/results.jsonl) as a table: one row per run, plus its step-1 memory breakdown.

    python benchmarks/results_table.py runs/results.jsonl [--markdown] [--scaling]

--scaling prints the multi-GPU view instead (benchmarks/gpu_multi.sh): throughput against the one-GPU run of the
same model, and every rank's peak memory.
"""

import argparse
import sys

import altscale.patches.bitsandbytes  # noqa: F401  (first: it quiets a bitsandbytes import-time warning)
from altscale.callbacks.results import read_records
from altscale.benchmarks.tables import HEADER, SCALING_HEADER, aligned, rows, scaling_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_file")
    parser.add_argument("--markdown", action="store_true", help="Print a Markdown table for BENCHMARKS.md.")
    parser.add_argument("--scaling", action="store_true", help="Throughput against one GPU, peak memory per rank.")
    args = parser.parse_args()
    records = read_records(args.results_file)
    header, table = (SCALING_HEADER, scaling_rows(records)) if args.scaling else (HEADER, rows(records))
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in table:
            print("| " + " | ".join(row) + " |")
        return
    print(aligned(header, table))
    if args.scaling:
        print("efficiency: samples/s per GPU after step 1, over the one-GPU run's; peak: CUDA peak allocated per rank")
    else:
        print("memory columns: GiB on rank 0 after the optimizer step of step 1; act+other is a residual "
              "(alloc - the rest)")


if __name__ == "__main__":
    main()
