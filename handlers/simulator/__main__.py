"""Run a Pollux workload with the static baseline: `python -m handlers.simulator`.

The thin shell around workload.py: it reads arguments and prints, nothing else.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from handlers.simulator.workload import read_workload, run_static, summarize, workload_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload", nargs="?", default=None, help="CSV path (default workload-6)")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per node")
    args = parser.parse_args(argv)
    path = Path(args.workload) if args.workload else workload_path()
    result = run_static(read_workload(path), args.nodes, args.gpus)
    print(f"workload: {path}, cluster: {args.nodes} nodes x {args.gpus} GPUs")
    for line in summarize(result):
        print(line)
    return 0 if result.all_completed else 1


if __name__ == "__main__":
    raise SystemExit(main())
