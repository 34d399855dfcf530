"""`little-dragon`: one subcommand per pipeline stage, plus tools for users.

    little-dragon catalog [--verify]     the workload catalog (and its distinctness check)
    little-dragon search                 stage 1: MetaSchedule search
    little-dragon corpus [--workers N]   the pre-training corpus (design-space scripts, sharded)
    little-dragon data                   stage 2: training examples + pre-training corpus
    little-dragon validate               stage 3: Great Expectations validation (fails the pipeline)
    little-dragon sft                    stage 4: SFT (TRL; LoRA through PEFT for a pretrained base)
    little-dragon rl                     stage 5: RL with the shaped, measured reward (TRL GRPO)
    little-dragon evaluate               stage 6: gated evaluation, MLflow registry (champion alias)
    little-dragon pull [--dest DIR]      fetch models:/little-dragon@champion
    little-dragon optimize KERNEL        write, verify and time K scripts for your kernel; print the best
    little-dragon tune KERNEL            model-guided tuning into a MetaSchedule database (N candidates)
    little-dragon tune-model NETWORK.py  the same for every task of a Relax network, then end to end
    little-dragon codec-report           compactness of the script language

Each stage reads its section of params.yaml (`--params` to use another file); DVC stages
call exactly these commands.
"""

from __future__ import annotations

import argparse
import sys


def _catalog(args) -> int:
    from pipeline.stages import catalog

    catalog.main(args.params, check=args.verify)
    return 0


def _part(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r} is not a part I/N with 0 <= I < N")
    return i, n


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _search(args) -> int:
    from pipeline.stages import search

    search.main(args.params, progress=not args.quiet, stop_after=args.stop_after, cluster=args.cluster)
    return 0


def _codec_report(args) -> int:
    from pipeline.stages import codec_report

    codec_report.main(args.params)
    return 0


def _corpus(args) -> int:
    from pipeline.stages import corpus

    corpus.main(args.params, progress=not args.quiet, workers=args.workers, cluster=args.cluster)
    return 0


def _data(args) -> int:
    from pipeline.stages import data

    data.main(args.params, progress=not args.quiet)
    return 0


def _validate(args) -> int:
    from pipeline.stages import validate

    try:
        validate.main(args.params)
    except validate.ValidationFailed as err:
        print(f"little-dragon validate: {err}", file=sys.stderr)
        return 1
    return 0


def _sft(args) -> int:
    from pipeline.stages import sft

    sft.main(args.params, progress=not args.quiet)
    return 0


def _rl(args) -> int:
    from pipeline.stages import rl

    rl.main(args.params, progress=not args.quiet)
    return 0


def _evaluate(args) -> int:
    from pipeline.stages import evaluate

    if args.interim:
        from pipeline import interim

        try:
            out = interim.report(args.params)
        except interim.InterimError as err:
            print(f"little-dragon evaluate --interim: {err}", file=sys.stderr)
            return 2
        for label, m in out["per_model"].items():
            c, r = m["construction"], m["refinement"]
            print(f"evaluate (interim): {label} on {m['tasks_done']} of {out['tasks_total']} tasks: construction "
                  f"correctness {evaluate._fmt(c['correctness'])}, refinement {evaluate._fmt(r['correctness'])}, speedup "
                  f"{evaluate._fmt(c['speedup_geomean'])}, latency/MS@K {evaluate._fmt(m['vs_metaschedule']['latency_ratio'])}")
        return 0
    from pipeline.models import ModelError

    try:
        metrics = evaluate.main(args.params, progress=not args.quiet, stop_after=args.stop_after, part=args.part,
                                metaschedule_only=args.metaschedule_only, models_only=args.models_only)
    except ModelError as err:
        print(f"little-dragon evaluate: {err}", file=sys.stderr)
        return 2
    if "incomplete" in metrics:
        return 0 if not args.fail_on_gate else 1
    return 0 if metrics["gate"]["passed"] or not args.fail_on_gate else 1


def _pull(args) -> int:
    from pipeline import registry

    try:
        dest = registry.pull(args.dest)
    except registry.RegistryError as err:
        print(f"little-dragon pull: {err}", file=sys.stderr)
        return 1
    champ = registry.champion()
    print(f"pulled models:/{registry.NAME}@{registry.ALIAS} (version {champ['version']}) -> {dest}")
    return 0


def _mlflow_sync(args) -> int:
    from pipeline import tracking

    done = tracking.sync()
    for folder, run_id in done:
        print(f"logged {folder} -> run {run_id}")
    print(f"mlflow-sync: {len(done)} kept run(s) logged to {tracking.tracking_uri()}")
    return 0


def _target_arg(text: str):
    import json

    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            from pipeline.tvm_env import TargetError

            raise TargetError(f"--target is not valid JSON: {err}") from None
    return text


def _default_model(args, command: str) -> str | None:
    from pathlib import Path

    if args.model is not None:
        return args.model
    if not Path("models/champion").exists():
        print(f"little-dragon {command}: no model: run `little-dragon pull` (fetches the champion to "
              "models/champion) or pass --model DIR", file=sys.stderr)
        return None
    return "models/champion"


def _optimize(args) -> int:
    from pathlib import Path

    from pipeline import models, optimize

    model_dir = _default_model(args, "optimize")
    if model_dir is None:
        return 2
    try:
        r = optimize.optimize(args.kernel, _target_arg(args.target), args.attempts, model_dir, args.out,
                              timeout_s=args.timeout, free=args.free)
    except (optimize.KernelError, models.ModelError) as err:
        print(f"little-dragon optimize: {err}", file=sys.stderr)
        return 2
    failures = ", ".join(f"{k} {v}" for k, v in r["outcomes"].items() if v and k != "ok")
    if not r["verified"]:
        print(f"little-dragon optimize: no verified script among {r['attempts']} attempts ({failures}); "
              f"nothing written but {args.out}/result.json", file=sys.stderr)
        return 1
    print(Path(r["script"]).read_text().rstrip())
    print(f"# verified {r['outcomes']['ok']}/{r['attempts']} attempts ({failures or 'no failures'}); best "
          f"{r['latency_s'] * 1e6:.1f} us vs baseline {r['baseline_s'] * 1e6:.1f} us: {r['speedup']:.2f}x; "
          f"{r['seconds']:.1f} s")
    print(f"# script -> {r['script']}; scheduled TVMScript -> {r['scheduled']}")
    return 0


def _strategy_args(p) -> None:
    p.add_argument("--strategy", choices=["model", "ms-cost", "ms-rank"], default="model",
                   help="model: the language model writes and refines (default); ms-cost: MetaSchedule's evolutionary "
                        "search ranked by the cost model pre-trained on the target's campaign (no language model); "
                        "ms-rank: the same search ranked by the pairwise ranking model on that data")
    p.add_argument("--focus", type=int, default=None,
                   help="ms-cost/ms-rank: times the model counts this kernel's measurements against the campaign's "
                        "(default 16)")


def _cost_model_args(p) -> None:
    p.add_argument("--oversample", type=int, default=1,
                   help="the model writes this many times the batch and a cost model picks what to measure (1: no cost model)")
    p.add_argument("--cost-data", default=None,
                   help="search work folder the cost model pre-trains on (default: the target's campaign in databases/)")
    p.add_argument("--no-fill", dest="fill", action="store_false",
                   help="measure the model's scripts only (default: a round with too few new ones is filled from "
                        "the design space)")


def _strategy_conflict(args) -> str | None:
    """The options the chosen --strategy does not take, as a one-line error (None: none given)."""
    if args.strategy != "model" and (args.model is not None or args.oversample != 1 or not args.fill):
        return f"--model, --oversample and --no-fill are for --strategy model ({args.strategy} uses no language model)"
    if args.strategy == "model" and args.focus is not None:
        return "--focus is for --strategy ms-cost or ms-rank"
    return None


def _focus(args) -> int:
    from pipeline.tune_search import FOCUS

    return FOCUS if args.focus is None else args.focus


def _tune(args) -> int:
    from pipeline import models, optimize, tune

    if (err := _strategy_conflict(args)) is not None:
        print(f"little-dragon tune: {err}", file=sys.stderr)
        return 2
    if args.strategy != "model":
        return _tune_ms_cost(args)
    model_dir = _default_model(args, "tune")
    if model_dir is None:
        return 2
    try:
        r = tune.tune(args.kernel, _target_arg(args.target), args.trials, model_dir, args.work_dir,
                      batch=args.batch, timeout_s=args.timeout, progress=not args.quiet,
                      oversample=args.oversample, cost_data=args.cost_data, fill=args.fill)
    except (optimize.KernelError, models.ModelError) as err:
        print(f"little-dragon tune: {err}", file=sys.stderr)
        return 2
    print(tune.main_summary(r, args.work_dir))
    return 0 if r.best_latency_s else 1


def _tune_ms_cost(args) -> int:
    from pipeline import optimize, tune_search

    try:
        r = tune_search.tune(args.kernel, _target_arg(args.target), args.trials, args.work_dir, batch=args.batch,
                             focus=_focus(args), cost_data=args.cost_data,
                             timeout_s=args.timeout, progress=not args.quiet, params_path=args.params,
                             ranker=args.strategy == "ms-rank")
    except optimize.KernelError as err:
        print(f"little-dragon tune: {err}", file=sys.stderr)
        return 2
    print(tune_search.main_summary(r, args.work_dir, ranker=args.strategy == "ms-rank"))
    return 0 if r.best_latency_s else 1


def _tune_model(args) -> int:
    from pipeline import models, optimize, tune_model

    if (err := _strategy_conflict(args)) is not None:
        print(f"little-dragon tune-model: {err}", file=sys.stderr)
        return 2
    model_dir = None
    if args.strategy == "model" and (model_dir := _default_model(args, "tune-model")) is None:
        return 2
    try:
        r = tune_model.tune_model(args.network, _target_arg(args.target), args.trials_per_task, model_dir,
                                  args.work_dir, batch=args.batch, timeout_s=args.timeout, progress=not args.quiet,
                                  oversample=args.oversample, cost_data=args.cost_data, fill=args.fill,
                                  strategy=args.strategy, focus=_focus(args),
                                  params_path=args.params)
    except (optimize.KernelError, models.ModelError) as err:
        print(f"little-dragon tune-model: {err}", file=sys.stderr)
        return 2
    print(tune_model.main_summary(r, args.work_dir))
    return 0 if r["matches_untuned"] else 1


def _bench_records(args) -> int:
    from pipeline.bench import records as bench_records

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
    p.add_argument("--stop-after", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="start no new shard after this many seconds (a bounded campaign step; resumable)")
    p.add_argument("--cluster", default=None, metavar="ADDRESS",
                   help='tune the shards on Dask: "local" or a running scheduler (tcp://host:8786); default: params')
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_search)

    p = sub.add_parser("corpus", help="the pre-training corpus: design-space scripts, parallel, sharded, resumable")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: corpus.workers; 0 = all cores)")
    p.add_argument("--cluster", default=None, metavar="ADDRESS",
                   help="a running Dask scheduler (tcp://host:8786); default: a local cluster of --workers processes")
    p.set_defaults(func=_corpus)
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

    p = sub.add_parser("evaluate", help="stage 6: gated evaluation; registers models in MLflow")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--fail-on-gate", action="store_true", help="exit 1 when the candidate fails a gate")
    p.add_argument("--stop-after", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="start no new task after SECONDS, nor a model's batch not expected to end by then "
                        "(an evaluation in steps; keep results with evaluate.archive_dir)")
    p.add_argument("--part", type=_part, default=None, metavar="I/N",
                   help="only every N-th task from the I-th (one process per GPU; results kept in evaluate.archive_dir)")
    phase = p.add_mutually_exclusive_group()
    phase.add_argument("--metaschedule-only", action="store_true",
                       help="run the MetaSchedule baseline phase alone and keep it in evaluate.archive_dir (no model needed)")
    phase.add_argument("--models-only", action="store_true",
                       help="run the models' phase alone, on the tasks whose MetaSchedule run is kept in evaluate.archive_dir")
    phase.add_argument("--interim", action="store_true",
                       help="the figures so far of an evaluation in steps, from evaluate.archive_dir alone (interim.json, "
                            "interim.md beside the metrics; nothing run, generated or registered)")
    p.set_defaults(func=_evaluate)

    p = sub.add_parser("pull", help="fetch the champion model from the MLflow registry")
    p.add_argument("--dest", default="models/champion", help="folder to write it to (default: models/champion)")
    p.set_defaults(func=_pull)

    p = sub.add_parser("mlflow-sync", help="log the runs kept in mlruns-pending/ (trained where MLflow was not available)")
    p.set_defaults(func=_mlflow_sync)

    p = sub.add_parser("optimize", help="optimize a kernel with the model; prints the best verified script")
    p.add_argument("kernel", help="a TVMScript file with a PrimFunc, or a Python file that builds one (TE)")
    p.add_argument("--target", default='{"kind": "llvm", "num-cores": 2}', help="TVM target: JSON or a tag")
    p.add_argument("--attempts", type=int, default=8, help="scripts to generate and verify (K)")
    p.add_argument("--model", default=None, help="model directory (default: models/champion)")
    p.add_argument("--out", default="optimized", help="output folder (default: optimized)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per script check")
    p.add_argument("--free", action="store_true",
                   help="sample freely instead of guiding by the kernel's design space (shows the model's own validity)")
    p.set_defaults(func=_optimize)

    p = sub.add_parser("tune", help="model-guided tuning: construction, then refinement of the best, until N are measured")
    p.add_argument("kernel", help="a TVMScript file with a PrimFunc, or a Python file that builds one (TE)")
    p.add_argument("--target", default='{"kind": "llvm", "num-cores": 2}', help="TVM target: JSON or a tag")
    p.add_argument("--trials", type=int, default=16, help="distinct candidates to measure (N)")
    p.add_argument("--batch", type=int, default=8, help="scripts the model writes per round (ms-cost: candidates a round)")
    _strategy_args(p)
    _cost_model_args(p)
    p.add_argument("--model", default=None, help="model folder (default: models/champion from `little-dragon pull`)")
    p.add_argument("--work-dir", default="tuned", help="MetaSchedule database and tune.jsonl (resumable)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per phase of each check")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_tune)

    p = sub.add_parser("tune-model", help="model-guided tuning of a Relax network: every task, then the network end to end")
    p.add_argument("network", help="a Python file that builds a Relax IRModule (relax.frontend.nn, the PyTorch exporter)")
    p.add_argument("--target", default='{"kind": "llvm", "num-cores": 2}', help="TVM target: JSON or a tag")
    p.add_argument("--trials-per-task", type=int, default=16, help="distinct candidates to measure per task (N)")
    p.add_argument("--batch", type=int, default=8, help="scripts the model writes per round (ms-cost: candidates a round)")
    _strategy_args(p)
    _cost_model_args(p)
    p.add_argument("--model", default=None, help="model folder (default: models/champion from `little-dragon pull`)")
    p.add_argument("--work-dir", default="tuned-model", help="one MetaSchedule database per task + result.json (resumable)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per phase of each check")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_tune_model)

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
