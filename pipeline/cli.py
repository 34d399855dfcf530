"""`little-dragon`: one subcommand per pipeline stage, plus tools for users.

    little-dragon catalog [--verify]     the workload catalog (and its distinctness check)
    little-dragon search                 stage 1: MetaSchedule search
    little-dragon data                   stage 2: training examples + pre-training corpus
    little-dragon validate               stage 3: Great Expectations validation (fails the pipeline)
    little-dragon sft                    stage 4: SFT (TRL; LoRA through PEFT for a pretrained base)
    little-dragon rl                     stage 5: RL with the shaped, measured reward (TRL GRPO)
    little-dragon codec-report           compactness of the script language

Each stage reads its section of params.yaml (`--params` to use another file); DVC stages
call exactly these commands.
"""

from __future__ import annotations

import argparse
import sys


def _catalog(args) -> int:
    from pipeline import catalog_stage

    catalog_stage.main(args.params, check=args.verify)
    return 0


def _search(args) -> int:
    from pipeline import search

    search.main(args.params, progress=not args.quiet)
    return 0


def _codec_report(args) -> int:
    from pipeline import codec_report

    codec_report.main(args.params)
    return 0


def _data(args) -> int:
    from pipeline import dataset

    dataset.main(args.params, progress=not args.quiet)
    return 0


def _validate(args) -> int:
    from pipeline import validate

    try:
        validate.main(args.params)
    except validate.ValidationFailed as err:
        print(f"little-dragon validate: {err}", file=sys.stderr)
        return 1
    return 0


def _sft(args) -> int:
    from pipeline import train_sft

    train_sft.main(args.params, progress=not args.quiet)
    return 0


def _rl(args) -> int:
    from pipeline import train_rl

    train_rl.main(args.params, progress=not args.quiet)
    return 0


def _bench_records(args) -> int:
    from pipeline import bench_records

    result = bench_records.main(args.records)
    return 0 if result["within_limit"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="little-dragon", description=__doc__.split("\n")[0])
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("catalog", help="write the workload catalog")
    p.add_argument("--verify", action="store_true", help="hash every workload: distinctness and held-out check")
    p.set_defaults(func=_catalog)

    p = sub.add_parser("search", help="stage 1: MetaSchedule search over a slice of the catalog")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_search)

    p = sub.add_parser("data", help="stage 2: training examples and the pre-training corpus")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_data)

    p = sub.add_parser("validate", help="stage 3: Great Expectations validation of the training data")
    p.set_defaults(func=_validate)

    p = sub.add_parser("sft", help="stage 4: supervised fine-tuning (from scratch, or LoRA on a local base)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_sft)

    p = sub.add_parser("rl", help="stage 5: GRPO from models/sft with the measured reward")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_rl)

    p = sub.add_parser("bench-records", help="benchmark: memory of building examples from 1M records")
    p.add_argument("--records", type=int, default=1_000_000)
    p.set_defaults(func=_bench_records)

    p = sub.add_parser("codec-report", help="measure the script language's compactness")
    p.set_defaults(func=_codec_report)

    args = parser.parse_args(argv)
    from pipeline.params import ParamsError
    from pipeline.tvm_env import TargetError

    try:
        return args.func(args)
    except (ParamsError, TargetError) as err:
        print(f"little-dragon {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
