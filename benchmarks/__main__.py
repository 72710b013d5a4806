"""`python -m benchmarks`: the suite of scenarios on the real stack (benchmarks/scenarios.py).

  list                      the scenarios: question, workload, sides, baseline, repeats, runs on disk
  run NAME [--repeats N]    run a scenario's pending runs (resumable), then rebuild its results file
  report [REPORT ...]       rebuild results files (default: all) and the README's results table

A run needs the whole machine: nothing else heavy beside it. The offline suites have their own
commands (docs/benchmarks.md): `benchmarks.accuracy` (the predictor), `benchmarks.forelen` (the
length dataset), `benchmarks.simulator` (predict, calibrate, validate, scale), `benchmarks.online`,
`benchmarks.reliability`.
"""

from __future__ import annotations

import argparse
import os

from benchmarks.scenarios import SCENARIOS


def _list() -> None:
    from benchmarks.replay.runs import runs_of

    for s in SCENARIOS.values():
        done = sum(len(runs_of(f"{s.name}/{side.name}")) for side in s.sides)
        wanted = sum(s.repeats_of(side) for side in s.sides)
        print(f"{s.name:<22} -> {s.report}.md  [{done}/{wanted} runs]  {s.question}")
        print(f"{'':<25}sides {', '.join(side.name for side in s.sides)} against {s.baseline}; "
              + ", ".join(f"{k} {v}" for k, v in vars(s.workload).items()))


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    r = sub.add_parser("run")
    r.add_argument("name", choices=sorted(SCENARIOS))
    r.add_argument("--repeats", type=int, help="more (or fewer) repeats than the table's")
    rep = sub.add_parser("report")
    rep.add_argument("reports", nargs="*")
    args = p.parse_args(argv)
    if args.command == "list":
        _list()
    elif args.command == "run":
        from benchmarks import runner

        runner.run(SCENARIOS[args.name], args.repeats)
    else:
        from benchmarks import report

        for name in args.reports or report.all_reports():
            report.write(name)


if __name__ == "__main__":
    main()
