"""An evaluation in steps, read before it is finished: the figures over the tasks done so far.

    little-dragon --params profiles/gpu.yaml evaluate --interim

The gated evaluation writes its metrics only in the step that finds every task done (the GPU
profile's takes several sessions). Until then this reads `evaluate.archive_dir` alone: the
kept MetaSchedule runs with their re-timing, and each model's kept results (only those of the
model files and generation settings in params now), and computes the evaluation's own metrics
(pipeline.stages.evaluate.model_metrics) for each model over the tasks it has finished, and
rl_vs_sft over the tasks both have. Written beside the final report as `interim.json` and `interim.md`, each saying how
many of the tasks it covers; no gate decision, nothing registered. Nothing is built, run or
generated, so it runs anywhere (no GPU, no TVM build).
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import replace
from pathlib import Path

from pipeline import files
from pipeline.stages import evaluate as E


class InterimError(ValueError):
    """Nothing to report: no archive, or no kept result of the current models."""


def _task_names(p: E.EvalParams, archive: Path) -> dict[str, str]:
    """Archive file name -> task key: te_workload names come from params (':' is '_' on disk)."""
    te = {E._dirname(f"te:{item}"): f"te:{item}" for item in p.te_suite}
    return {path.stem: te.get(path.stem, path.stem) for path in sorted((archive / "tasks").glob("*.json"))}


def _ms_seconds(archive: Path, name: str) -> float:
    """A kept MetaSchedule run's wall time (its share of its group's run), 0 if not kept."""
    tar = archive / "metaschedule" / f"{name}.tar.xz"
    if not tar.exists():
        return 0.0
    with tarfile.open(tar) as t:
        return float(json.load(t.extractfile("summary.json"))["seconds"])


def collect(p: E.EvalParams, g, labels: list[str]) -> tuple[list[E.Task], dict, dict, int]:
    """(the tasks whose baseline is ready: MetaSchedule's run re-timed (or failed), or an
    untimed te_workload kernel; per label the results kept for the current model files and
    generation settings; the candidate's free-sampling results kept for them; how many tasks
    the archive knows)."""
    from pipeline.generate import sampling_key
    from pipeline.registry import model_digest

    archive = Path(p.archive_dir)
    test = {r["workload"] for r in files.read_jsonl(Path(p.dataset_dir) / "test.jsonl")}
    gen = sampling_key(g)
    digests = {label: model_digest(p.models[label]) for label in labels}
    # label -> (the key its kept results must carry): the models, and the candidate with a cost model
    expect = {label: {"model": digests[label], "generation": gen} for label in labels}
    rerank = E.rerank_label(p)
    if rerank and p.candidate in digests:
        expect[rerank] = {"model": digests[p.candidate], "generation": {**gen, "attempts": g.attempts * p.rerank_oversample},
                          **E.pick_key(g.attempts, p.rerank_compile_check)}
    names = _task_names(p, archive)
    tasks, results, free_results = [], {label: {} for label in expect}, {}
    for name, key in names.items():
        kept = json.loads((archive / "tasks" / f"{name}.json").read_text())
        source = "te_workload" if key.startswith("te:") else "test" if key in test else "catalog"
        t = E.Task(key, source, None, timed=source != "te_workload" or key[3:] in p.te_timed)
        if t.timed:
            if "metaschedule_failed" in kept:
                t.ms_error = kept["metaschedule_failed"]["error"]
            elif "metaschedule" in kept:
                t.ms_outcomes = [E._outcome(o) for o in kept["metaschedule"]["outcomes"]]
                t.ms_seconds = _ms_seconds(archive, name)
            else:
                continue            # tuned but not re-timed yet: no baseline to compare with
        tasks.append(t)
        for label, want in expect.items():
            for field_name, entry in kept.items():
                if (field_name.startswith(f"model:{label}:guided:") and entry["key"]["model"] == want["model"]
                        and entry["key"]["generation"] == want["generation"] and entry["key"].get("pick") == want.get("pick")
                        and entry["key"].get("compile_check") == want.get("compile_check")):
                    results[label][key] = E._result_from_json(entry["result"])
        free = kept.get(f"model:{p.candidate}:free:no-refinements")
        if (free and p.candidate in digests and free["key"]["model"] == digests[p.candidate]
                and free["key"]["generation"] == {**gen, "guided": False}):
            free_results[key] = E._result_from_json(free["result"])
    return tasks, results, free_results, len(names)


def report(params_path: str) -> dict:
    """interim.json + interim.md beside evaluate.metrics; returns the figures."""
    p, _, g, _, _, _ = E._settings(params_path)
    if not p.archive_dir or not (Path(p.archive_dir) / "tasks").is_dir():
        raise InterimError(f"evaluate.archive_dir ({p.archive_dir}) holds no kept tasks: run evaluate in steps first")
    labels = [label for label, d in p.models.items() if Path(d).exists()]
    if not labels:
        raise InterimError(f"none of the models {sorted(p.models.values())} exists")
    tasks, results, free, known = collect(p, g, labels)
    labels = [label for label in results if results[label]]
    if not labels:
        raise InterimError(f"{p.archive_dir} has no kept model results for the current model files and "
                           "generation settings: run evaluate --models-only first")
    total = len(p.te_suite) + p.catalog_workloads + len({r["workload"] for r in
                                                          files.read_jsonl(Path(p.dataset_dir) / "test.jsonl")})
    # each model over the tasks it finished; RL and SFT compared on the tasks both finished
    per_model = {}
    for label in labels:
        done = [t for t in tasks if t.key in results[label]]
        per_model[label] = {"tasks_done": len(done), **E.model_metrics(results[label], done, p.attempts)}
        if label == E.rerank_label(p):      # best-predicted scripts that did not compile, replaced by the next
            per_model[label]["compile_rejected"] = sum(r.get("compile_rejected", 0) for r in results[label].values())
    candidate = p.candidate if p.candidate in labels else labels[0]
    out = {"interim": True, "tasks_total": total, "tasks_with_baseline": len(tasks), "tasks_in_archive": known,
           "models": labels, "attempts": p.attempts, "metaschedule_trials": p.metaschedule_trials,
           "candidate": candidate, "per_model": per_model,
           "gate_if_final": E.gate(per_model[candidate], p.gates)}
    if free:      # the candidate sampled freely (construction prompts only), beside guided
        constructions = [replace(t, refinements=[]) for t in tasks if t.key in free]
        fm = E.model_metrics(free, constructions, p.attempts)
        out["free_sampling"] = {"model": p.candidate, "tasks_done": len(constructions),
                                "construction": {k: fm["construction"][k] for k in
                                                 ("correctness", "attempts", "failures_by_stage")},
                                "decoding": E.decoding_figures(free)}
    if "rl" in results and "sft" in results:
        both = [t for t in tasks if t.key in results["rl"] and t.key in results["sft"]]
        if both:
            out["rl_vs_sft"] = E.rl_vs_sft(results["rl"], results["sft"], both)
    base = Path(p.metrics).parent
    files.write_json(base / "interim.json", out)
    out_plot = E.speedup_plot(per_model, candidate, p.attempts, p.metaschedule_trials, base / "interim_speedup.png",
                              f"per task, in the order of {candidate}'s speedup (interim); no point: no correct script")
    _markdown(out, base / "interim.md", out_plot)
    return out


def _markdown(m: dict, path: Path, plot: str | None = None) -> None:
    f = E._fmt
    done = ", ".join(f"{label} {x['tasks_done']}" for label, x in m["per_model"].items())
    lines = [f"# Evaluation so far (interim: {done} of {m['tasks_total']} tasks)", "",
             f"Read from the evaluation's archive by `evaluate --interim`: each model over the tasks it has finished, "
             f"MetaSchedule@{m['metaschedule_trials']} re-timed by the same checker ({m['tasks_with_baseline']} tasks have "
             f"it so far). Not the gated evaluation: nothing registered. K = {m['attempts']} attempts per prompt; "
             "guided decoding.", "",
             "| model | tasks | construction correctness | refinement correctness | construction speedup | "
             "refinement speedup | vs source | latency / MS@K | latency / MS full | tasks without a correct kernel |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, x in m["per_model"].items():
        c, r, v = x["construction"], x["refinement"], x["vs_metaschedule"]
        lines.append(f"| {label} | {x['tasks_done']} | {f(c['correctness'])} ({c['attempts']}) | {f(r['correctness'])} ({r['attempts']}) | "
                     f"{f(c['speedup_geomean'])} | {f(r['speedup_geomean'])} | {f(r['speedup_vs_source_geomean'])} | "
                     f"{f(v['latency_ratio'])} | {f(v['latency_ratio_full_budget'])} | "
                     f"{c['timed_tasks_without_correct_script']} of {c['timed_tasks']} |")
    if "rl_vs_sft" in m:
        r = m["rl_vs_sft"]
        lines += ["", f"RL vs SFT: RL faster on {r['construction_wins']} of {r['construction_tasks']} construction "
                  f"tasks and {r['refinement_wins']} of {r['refinement_prompts']} refinement prompts."]
    fs = m.get("free_sampling")
    if fs:
        lines += ["", f"Free sampling ({fs['model']}, the construction prompts of {fs['tasks_done']} tasks, same checker): "
                  f"correctness {f(fs['construction']['correctness'])} ({fs['construction']['attempts']}; failures "
                  f"{fs['construction']['failures_by_stage']}), against guided above."]
    gate = m["gate_if_final"]
    lines += ["", f"The gate on {m['candidate']}'s figures so far would {'pass' if gate['passed'] else 'fail'}"
              + ("." if gate["passed"] else ": " + "; ".join(gate["reasons"]) + ".")]
    if plot:
        lines += ["", f"![speedup over the baseline per task]({Path(plot).name})"]
    lines += ["", f"## Per task ({m['candidate']})", "", "| task | set | baseline s | model best s | speedup | MS@K s | "
              "MS full s | construction correct | refinement correct |", "|---|---|---|---|---|---|---|---|---|"]
    for t in m["per_model"][m["candidate"]]["per_task"]:
        lines.append(f"| {t['task']} | {t['source']} | {f(t.get('baseline_s'), '.3g')} | {f(t.get('best_s'), '.3g')} | "
                     f"{f(t.get('speedup'))} | {f(t.get('metaschedule_at_k_s'), '.3g')} | "
                     f"{f(t.get('metaschedule_full_s'), '.3g')} | {t['correct_attempts']}/{t['attempts']} | "
                     f"{t['refinement_correct']}/{t['refinement_attempts']} |")
    files.write_text_atomic(str(path), "\n".join(lines) + "\n")
