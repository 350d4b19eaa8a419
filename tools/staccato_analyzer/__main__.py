import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="staccato_analyzer",
                                 description="Analyze `staccato bench run` run directories.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("analyze", help="tables, analysis.json and plots for one run directory")
    a.add_argument("run_dir")
    c = sub.add_parser("compare", help="overlay several runs; ratios vs the first")
    c.add_argument("run_dirs", nargs="+")
    c.add_argument("--out", help="output directory (default: <first run's parent>/compare-<timestamp>)")
    args = ap.parse_args(argv)

    import os

    for d in [args.run_dir] if args.cmd == "analyze" else args.run_dirs:
        if not os.path.isfile(os.path.join(d, "run.json")):
            print(f"error: {d} is not a run directory (no run.json); `staccato bench run` makes them",
                  file=sys.stderr)
            return 2
    from . import analyze as A  # imported late so --help works without numpy

    if args.cmd == "analyze":
        A.analyze(args.run_dir)
    else:
        A.compare(args.run_dirs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
