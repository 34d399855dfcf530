"""The model inside MetaSchedule: a search strategy whose first batch of each task the model
writes, after which MetaSchedule's evolutionary search goes on as usual (seeded by the
database, which now holds the model's measured candidates, and a cost model trained on them).

Existing MetaSchedule code gets it with one argument:

    from pipeline.model_strategy import ModelFirst
    ms.tune_tir(mod, target, work_dir, max_trials_global=64, strategy=ModelFirst("models/champion"))
    ms.relax_integration.tune_relax(mod, params, target, work_dir, 256, strategy=ModelFirst(...))

The project's cost model, pre-trained on the target's search campaign kept in git, goes in the
same way, with or without the model (one more argument; `ms_cost` / `model_first_cost` in
pipeline.bench.tune; note that TVM's `tune_tir` sets up its loggers from the names of the handlers
on the `tvm.s_tir.meta_schedule` logger and fails on an unnamed one, as pytest's capture adds):

    from pipeline import cost_model
    xgb = cost_model.for_target(target)[0].as_metaschedule()
    ms.tune_tir(mod, target, work_dir, max_trials_global=16, cost_model=xgb)

The model writes with guided decoding (every script inside the task's design space, so it
decodes, applies and is postprocessed); a script TVM still refuses is dropped, never sent to
the builder. If the model writes nothing usable for a task, its first batch comes from the
evolutionary search.

The first batch can come from elsewhere than the model: `proposer=` takes an object with
`propose(mod) -> [Proposal]` (pipeline.transfer.Library: the campaign's best scripts of other
workloads carried onto this kernel). With more than the batch, `transfer.first` picks which,
by the search's cost model (`rank="cost"`) or the least changed first (`rank="nearest"`).
"""

from __future__ import annotations

from pipeline.tvm_env import ms, tvm


@tvm.ir.utils.derived_object
class ModelFirst(ms.search_strategy.PySearchStrategy):
    def __init__(self, model=None, batch: int = 16, population_size: int = 512, genetic_num_iters: int = 4,
                 seed: int = 0, proposed: list | None = None, proposer=None, rank: str = "cost") -> None:
        """`model`: a model folder, or a (model, tokenizer) pair already loaded (shared by
        every task's copy of the strategy, as is `proposed`: the scripts the model wrote that
        went to measurement, in order). `proposer`: writes the first batch instead of a model."""
        super().__init__()
        if model is None and proposer is None:
            raise ValueError("ModelFirst needs a model or a proposer")
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            from pipeline import models

            model = models.load(model)
        self.model, self.batch, self.seed, self.proposer, self.rank = model, batch, seed, proposer, rank
        self.population_size, self.genetic_num_iters = population_size, genetic_num_iters
        self.evolve = ms.search_strategy.EvolutionarySearch(population_size=population_size,
                                                            genetic_num_iters=genetic_num_iters)
        self.context = None
        self.first = True
        self._pending, self._written = None, 0
        self.proposed: list[str] = proposed if proposed is not None else []
        self._seen: set[str] = set()

    def _initialize_with_tune_context(self, context) -> None:
        self.context = context
        self.evolve._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None) -> None:
        self.first, self.limit = True, min(max_trials, num_trials_per_iter, self.batch)
        # the evolutionary search starts after the model's batch, with what is left of the
        # budget (given all of it, it measured a full round past the budget: 24 for 16)
        self._pending = (max_trials, num_trials_per_iter, design_spaces, database, cost_model)
        self._written = 0

    def _start_evolve(self) -> None:
        if self._pending is not None:
            max_trials, per_iter, spaces, database, cost_model = self._pending
            self._pending = None
            self.evolve.pre_tuning(max(0, max_trials - self._written), per_iter, spaces, database, cost_model)

    def post_tuning(self) -> None:
        if self._pending is None:
            self.evolve.post_tuning()

    def generate_measure_candidates(self):
        if self.first:
            candidates = self._from_model()
            if candidates:
                self._written = len(candidates)
                return candidates
            self.first = False
        self._start_evolve()
        return self.evolve.generate_measure_candidates()

    def notify_runner_results(self, measure_candidates, results) -> None:
        if self.first:
            self.first = False
            return
        self.evolve.notify_runner_results(measure_candidates, results)

    def clone(self):
        return ModelFirst(self.model, self.batch, self.population_size, self.genetic_num_iters, self.seed,
                          self.proposed, self.proposer, self.rank)

    def _from_model(self) -> list:
        if self.proposer is not None:
            return self._from_proposer()
        from pipeline import codec
        from pipeline.describe import DescribeError, describe
        from pipeline.generate import GenerationParams, generate
        from pipeline.prompts import construction_prompt
        from pipeline.tvm_env import TVM_ERRORS, Schedule

        mod, target = self.context.mod, self.context.target
        try:
            prompt = construction_prompt(describe(mod), target.kind.name)
        except DescribeError:
            return []
        model, tok = self.model
        written = generate(model, tok, [prompt], GenerationParams(attempts=self.limit, guided=True),
                           seed=self.seed, kernels=[(mod, target)])
        out = []
        for script, done in zip(written.scripts[0], written.complete[0]):
            if not (script and done) or script in self._seen:
                continue
            try:
                sch = Schedule(mod, debug_mask=0)
                codec.decode(mod, script, target).apply_to_schedule(sch, remove_postproc=False)
            except (codec.DecodeError, *TVM_ERRORS):
                continue
            self._seen.add(script)
            self.proposed.append(script)
            out.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
        return out

    def _from_proposer(self) -> list:
        """The proposer's scripts; with more than the batch, the ones the search's cost model
        (trained or pre-trained; an untrained one scores at random) ranks fastest."""
        from pipeline.transfer import first

        proposals = self.proposer.propose(self.context.mod)
        cands = [ms.MeasureCandidate(p.sch, ms.arg_info.ArgInfo.from_prim_func(p.sch.mod["main"])) for p in proposals]
        cost_model = self._pending[4] if self._pending is not None else None
        scores = None
        if len(cands) > self.limit and cost_model is not None:
            scores = [float(x) for x in cost_model.predict(self.context, cands)]
        order = first(proposals, self.limit, scores, self.rank)
        self.proposed.extend(f"{proposals[i].source.workload}#{proposals[i].source.rank}" for i in order)
        return [cands[i] for i in order]
