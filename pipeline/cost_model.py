"""Which of the model's scripts to measure: MetaSchedule's XGBoost cost model over scripts.

A tuning budget counts measured candidates, and the model writes scripts much faster than
they can be built and timed. So `tune` lets the model write several times its batch and
measures the ones a cost model ranks best, as MetaSchedule's evolutionary search measures
the best-predicted of its population (tvm/s_tir/meta_schedule/search_strategy/
evolutionary_search.cc, with an epsilon-greedy share of the rest).

The cost model is MetaSchedule's own (tvm/s_tir/meta_schedule/cost_model/xgb_model.py):
per-store features of the postprocessed schedule, trained on the normalised throughput
min_cost / cost *inside each workload*, so what it learns on some kernels transfers to a new
one. It is pre-trained on measured search databases of catalog workloads (`pretrain`; the
training split only, never an evaluation kernel) and then updated with every candidate the
tuning measures. A script goes through the same decode -> apply path as everywhere else, so
the features of a stored record and of the model's script are the same thing (checked in
tests/test_cost_model.py).
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
from pathlib import Path

import numpy as np

from pipeline import codec, files, records
from pipeline.tvm_env import TVM_ERRORS, Schedule, make_target, ms, structural_hash

FAILED_COST = 1e10   # MetaSchedule's cost of a failed candidate (its XGBModel._mean_cost)


def _focus(xgb, pretrained: set[str], times: int) -> None:
    """Make an XGBModel's retraining (XGBModel.update's step 5, which passes every group's
    features and min_cost / cost once, group after group in `data`'s order) repeat the slices of
    the groups not in `pretrained` `times` times. The override sits on the Python instance
    behind TVM's derived-object wrapper, where `update` looks `_train` up."""
    inst = xgb._inst
    train = inst._train

    def _train(xs, ys):
        fx, fy, at = [], [], 0
        for key, g in inst.data.items():
            n = len(g.features)
            reps = 1 if key in pretrained else times
            fx += list(xs[at:at + n]) * reps
            fy += [ys[at:at + n]] * reps
            at += n
        train(xs=fx, ys=np.concatenate(fy))

    inst._train = _train


class CostModel:
    """Scores scripts of any workload on one target; higher is predicted faster."""

    def __init__(self, target, seed: int = 0):
        self.target = make_target(target)
        self.extractor = ms.feature_extractor.PerStoreFeature()
        # MetaSchedule's model object, for its training objective and prediction (_train,
        # _predict); the data lives here, grouped by workload as XGBModel.update groups it.
        self.xgb = ms.cost_model.XGBModel(num_warmup_samples=0, adaptive_training=False, verbose_eval=10**9)
        self.groups: dict[str, tuple[list[np.ndarray], list[float]]] = {}
        self.rng = random.Random(seed)
        self.trained_on = 0

    @property
    def size(self) -> int:
        return sum(len(c) for _, c in self.groups.values())

    # -- features -------------------------------------------------------------------------
    def features(self, mod, scripts: list[str]) -> list[np.ndarray | None]:
        """Per-store features of each script's postprocessed schedule (None: it does not apply)."""
        from pipeline import space

        cands, where = [], []
        for i, text in enumerate(scripts):
            try:
                sch = Schedule(mod, debug_mask=0)
                codec.decode(mod, text, self.target).apply_to_schedule(sch, remove_postproc=False)
            except (codec.DecodeError, *TVM_ERRORS):
                continue
            cands.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
            where.append(i)
        out: list[np.ndarray | None] = [None] * len(scripts)
        if cands:
            for i, f in zip(where, self.extractor.extract_from(space.context(self.target, mod), cands)):
                x = f.numpy().astype("float32")
                out[i] = x if len(x) else None
        return out

    # -- data -----------------------------------------------------------------------------
    def add(self, mod, scripts: list[str], latencies: list[float | None], train: bool = True) -> int:
        """Measured scripts of `mod` (latency None: failed, kept at MetaSchedule's failed cost,
        so the model learns what not to measure). Retrains unless `train` is False."""
        key = structural_hash(mod)
        feats, costs = self.groups.setdefault(key, ([], []))
        n = 0
        for x, lat in zip(self.features(mod, scripts), latencies):
            if x is not None:
                feats.append(x)
                costs.append(lat if lat else FAILED_COST)
                n += 1
        if train and n:
            self.train()
        return n

    def train(self) -> None:
        """XGBModel.update's step 5: every group's features against min_cost / cost."""
        xs, ys = [], []
        for feats, costs in self.groups.values():
            c = np.array(costs, dtype="float32")
            xs += feats
            ys.append(c.min() / c)
        if xs:
            self.xgb._train(xs=xs, ys=np.concatenate(ys))
            self.trained_on = len(xs)

    def copy(self, train: bool = True) -> "CostModel":
        """A fresh model on the same data (what `add` gives it next is its own): one pre-training
        shared by several tunes, as the tune benchmark's tasks share it. Trained unless `train`
        is False (a caller that only reads `groups`, such as pipeline.rank_model, skips it)."""
        out = CostModel(self.target)
        out.groups = {k: (list(f), list(c)) for k, (f, c) in self.groups.items()}
        if train:
            out.train()
        return out

    def as_metaschedule(self, focus: int = 1):
        """This model as MetaSchedule's own cost model object, for `ms.tune_tir` / the Relax
        tuning entry points / `tune_tasks` (`cost_model=`): an XGBModel that holds every
        candidate this one was trained on, grouped by workload, and is trained already, so the
        evolutionary search ranks its population by it from the first round (MetaSchedule's own
        starts empty and picks at random until it has measured). It goes on learning from the
        run's measurements, retraining each round on all of it. A fresh object each call.

        `focus` > 1: each retraining counts the run's own measurements (the workloads it tunes)
        `focus` times, the pre-training once: a kernel's first 16 candidates are otherwise one
        group in a hundred or more, and barely move a model of the whole campaign."""
        if focus < 1:
            raise ValueError(f"focus must be >= 1 (got {focus})")
        from collections import OrderedDict

        from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

        out = ms.cost_model.XGBModel(num_warmup_samples=0, adaptive_training=False, verbose_eval=10**9)
        out.data = OrderedDict((k, FeatureGroup(k, list(f), np.array(c, dtype="float32")))
                               for k, (f, c) in self.groups.items() if f)
        out.data_size = sum(len(g.features) for g in out.data.values())
        if out.data_size:
            xs = [x for g in out.data.values() for x in g.features]
            out._train(xs=xs, ys=np.concatenate([g.min_cost / g.costs for g in out.data.values()]))
        if focus > 1:
            _focus(out, set(out.data), focus)
        return out

    # -- ranking --------------------------------------------------------------------------
    def scores(self, mod, scripts: list[str]) -> list[float | None]:
        """Predicted normalised throughput per script (None: it does not apply); random before
        any training, as MetaSchedule's model answers before its warm-up."""
        feats = self.features(mod, scripts)
        ok = [i for i, x in enumerate(feats) if x is not None]
        out: list[float | None] = [None] * len(scripts)
        if not ok:
            return out
        if self.xgb.booster is None:
            pred = [self.rng.random() for _ in ok]
        else:
            pred = self.xgb._predict(xs=[feats[i] for i in ok]).tolist()
        for i, p in zip(ok, pred):
            out[i] = float(p)
        return out

    def pick(self, mod, scripts: list[str], n: int, epsilon: float = 0.05, rest: bool = False) -> list[str]:
        """The `n` best-predicted scripts, a share `epsilon` of them drawn at random from the
        rest (MetaSchedule's eps-greedy, so a wrong model still sees something new). With
        `rest`, the other scripts follow them, best-predicted first (those it has no prediction
        for last): the stand-ins for a chosen one that a later check drops."""
        scores = self.scores(mod, scripts)
        ranked = sorted((i for i, s in enumerate(scores) if s is not None), key=lambda i: -scores[i])
        n_random = min(int(round(n * epsilon)), max(0, len(ranked) - n))
        chosen = ranked[: n - n_random]
        chosen += self.rng.sample(ranked[n - n_random:], n_random)
        if rest:
            chosen += [i for i in ranked if i not in chosen] + [i for i, s in enumerate(scores) if s is None]
        return [scripts[i] for i in chosen]

    # -- kept features --------------------------------------------------------------------
    def save_arrays(self, path: Path | str, key: dict) -> None:
        """The training data as flat arrays (a candidate's features are stores x 164)."""
        rows, stores, group, costs, names = [], [], [], [], list(self.groups)
        for g, name in enumerate(names):
            feats, c = self.groups[name]
            rows += feats
            stores += [len(x) for x in feats]
            group += [g] * len(feats)
            costs += c
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(tmp, key=json.dumps(key), names=np.array(names), stores=np.array(stores, dtype="int64"),
                            group=np.array(group, dtype="int64"), costs=np.array(costs, dtype="float64"),
                            x=np.concatenate(rows) if rows else np.zeros((0, 164), dtype="float32"))
        tmp.replace(path)

    def load_arrays(self, z) -> None:
        """The inverse of save_arrays. Each array is read from `z` once: an NpzFile decompresses
        an array on every access (indexing `z["x"]` per candidate took 46 s for 2,634)."""
        names = [str(n) for n in z["names"]]
        x, stores, group, costs_all = z["x"], z["stores"], z["group"], z["costs"]
        bounds = np.concatenate([[0], np.cumsum(stores)])
        self.groups = {n: ([], []) for n in names}
        for i, (g, c) in enumerate(zip(group, costs_all)):
            feats, costs = self.groups[names[g]]
            feats.append(x[bounds[i]:bounds[i + 1]])
            costs.append(float(c))

    # -- pre-training ---------------------------------------------------------------------
    def pretrain(self, search_dir: Path | str, exclude: set[str] = frozenset(), progress: bool = False) -> dict:
        """Every measured candidate of a search work folder (shards with `workloads.json`)
        whose target kind is this model's, except workloads whose id is in `exclude`."""
        from tqdm import tqdm

        from pipeline.workloads import Spec, build

        entries, by_workload = campaign_records(search_dir, self.target.kind.name, exclude)
        used = 0
        for h in tqdm(sorted(by_workload), desc="cost model data", unit="workload", disable=not progress):
            mod = build(Spec.from_json(entries[h]))
            scripts, lats = [], []
            for ref in by_workload[h]:
                try:
                    scripts.append(codec.canonical_from_json(mod, records.trace_at(ref)))
                    lats.append(ref.latency_s)
                except (codec.DecodeError, TypeError, ValueError):
                    continue
            used += self.add(mod, scripts, lats, train=False)
        self.train()
        return {"workloads": len(by_workload), "records": used}


def training_split_exclusions(data_params) -> set[str]:
    """Workload ids the data stage puts in validation or test: evaluation kernels, which a
    cost model must not learn from (the same assignment the data stage makes)."""
    from pipeline.stages.data import assign_splits, frozen_splits

    entries = {w["hash"]: w["id"] for w in records.workload_entries(data_params.search_dir).values()}
    # the data stage splits the workloads that have a correct candidate (stages/data.py)
    ids = {entries[r.workload_hash] for shard in records.shard_dirs(data_params.search_dir)
           for r in records.scan(shard) if r.latency_s is not None and r.workload_hash in entries}
    splits = assign_splits(sorted(ids), data_params.val_fraction, data_params.test_fraction, data_params.seed,
                           frozen_splits(data_params))
    return {i for i, s in splits.items() if s != "train"}


def pretrained(target, search_dir: Path | str, exclude: set[str], cache_dir: Path | str | None = None,
               progress: bool = False) -> CostModel:
    """A CostModel pre-trained on `search_dir`. With `cache_dir`, the features are kept there
    (`cost_model-<kind>.npz`, keyed by the databases' sizes, the exclusions and this code), so
    the next tune does not decode every record again."""
    model = CostModel(target)
    if cache_dir is None:
        model.pretrain(search_dir, exclude, progress)
        return model
    key = {"target": model.target.kind.name, "exclude": sorted(exclude), "code": files.source_digest(__file__, codec.__file__),
           "shards": [[s.name, (s / "database_tuning_record.json").stat().st_size
                       if (s / "database_tuning_record.json").exists() else 0] for s in records.shard_dirs(search_dir)]}
    path = Path(cache_dir) / f"cost_model-{model.target.kind.name}.npz"
    if path.exists():
        with np.load(path) as z:
            if json.loads(str(z["key"])) == key:
                model.load_arrays(z)
                model.train()
                return model
    model.pretrain(search_dir, exclude, progress)
    model.save_arrays(path, key)
    return model


# The search campaigns kept in git (databases/README.md), by target kind: what `tune`
# pre-trains its cost model on when no other search folder is named.
CAMPAIGNS = {"llvm": "databases/search-cpu", "cuda": "databases/search-gpu"}
REPO = Path(__file__).resolve().parent.parent


def for_target(target, search_dir: Path | str | None = None, cache_dir: Path | str = "data/cost-model",
               progress: bool = False) -> tuple[CostModel, str]:
    """(a cost model for `target`, where its data came from). Pre-trained on `search_dir`, or
    else on the campaign archive kept in git for the target's kind (unpacked to a temporary
    folder); without either it starts empty and learns from the tuning's own measurements.
    Either way the data stage's validation and test workloads of that search are left out."""
    model = CostModel(target)
    with campaign(model.target, search_dir) as (folder, exclude, source):
        if folder is None:
            return model, "none (it learns from this tuning's measurements only)"
        return pretrained(model.target, folder, exclude, cache_dir, progress), source


def campaign_records(search_dir: Path | str, kind: str, exclude: set[str] = frozenset(),
                     measured_only: bool = False) -> tuple[dict, dict]:
    """(workload entries by hash, {workload hash: [RecordRef]}) of a search folder's records whose
    workload's target kind is `kind` and whose id is not in `exclude`; with `measured_only`,
    only records with a latency."""
    entries = {w["hash"]: w for w in records.workload_entries(search_dir).values()}
    by_workload: dict[str, list[records.RecordRef]] = {}
    for shard in records.shard_dirs(search_dir):
        for ref in records.scan(shard):
            w = entries.get(ref.workload_hash)
            if (w and w["id"] not in exclude and (ref.latency_s is not None or not measured_only)
                    and make_target(w["target"]).kind.name == kind):
                by_workload.setdefault(ref.workload_hash, []).append(ref)
    return entries, by_workload


@contextlib.contextmanager
def campaign(target, search_dir: Path | str | None = None):
    """Yields (folder, exclusions, where it came from) of the search data for `target`:
    `search_dir`, or else the campaign archive kept in git for the target's kind, unpacked to a
    temporary folder for the block; (None, empty set, "none") without either. The exclusions are
    the data stage's validation and test workloads of that search: evaluation kernels, which
    nothing pre-trained may learn from (the campaign's kept `splits.json` where it has one, as the
    data stage's `splits_file`)."""
    from pipeline import archive
    from pipeline.stages.data import DataParams

    kind = make_target(target).kind.name
    kept = REPO / CAMPAIGNS[kind] if kind in CAMPAIGNS else None
    splits = kept / "splits.json" if kept is not None and (kept / "splits.json").exists() else None

    def exclusions(folder) -> set[str]:
        return training_split_exclusions(DataParams(search_dir=str(folder), splits_file=splits and str(splits)))

    if search_dir is not None:
        yield search_dir, exclusions(search_dir), str(search_dir)
        return
    if kept is None or not (kept / "index.json").exists():
        yield None, set(), "none"
        return
    with tempfile.TemporaryDirectory() as tmp:
        for name in json.loads((kept / "index.json").read_text()):
            archive.restore(Path(tmp) / name, kept)
        yield tmp, exclusions(tmp), str(kept.relative_to(REPO))
