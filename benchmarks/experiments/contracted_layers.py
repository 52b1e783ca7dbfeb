"""Dense layers contracted into matrix products against the scalar body, measured in one process.

Usage: python benchmarks/experiments/contracted_layers.py [--batch 100000] [--rounds 21]
                                                    [--workloads net-4-16-16-4,...]

Scalarized networks and their Jacobians through build_function, with the sums of a dense
layer contracted into matrix products (symkern.codegen.contract, the default) against the
scalar body (``BuildOptions(contract=False)``); for the 4-16-16-4 Jacobian, which
stays scalar by default, also the contracted and tiled form that bodies above
``SPLIT_ABOVE_OPERATIONS`` get (the limit lowered under its 4,658 operations). Timed
round-robin by ``shared_values_and_whole_bodies.measure`` (median M samples/s at the batch, first result at
1,024).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_values_and_whole_bodies import measure, passes, print_header  # noqa: E402

import symkern as sk  # noqa: E402

NETWORKS = ["net-4-16-16-4", "net-8-32-32-8", "jac-4-16-16-4", "jac-8-32-32-8"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--workloads", default=",".join(NETWORKS))
    args = parser.parse_args()
    print_header(args.batch, args.rounds)
    for name in args.workloads.split(","):
        variants = {"default": ({}, {}),
                    "scalar body": ({}, {"options": sk.BuildOptions(contract=False)})}
        if name == "jac-4-16-16-4":
            variants["contracted and tiled"] = ({(passes, "SPLIT_ABOVE_OPERATIONS"): 4000}, {})
        measure(name, variants, args.batch, args.rounds)


if __name__ == "__main__":
    main()
