"""Each repairer of the failure catalogue against its own kind's injected bugs, graded:
`python -m data_gen.repair_check`.

    python -m data_gen.repair_check                       # softmax, matmul, layer_norm, attention_fwd
    python -m data_gen.repair_check --task rms_norm --per-operator 3

For every injector of a kind that has a repairer: inject it into the tasks' solutions, keep the
mutants the grader fails as that kind, apply the kind's repairer (again while the kernel still
fails as that kind, a few rounds), and grade the result. The table it prints (injected,
changed, correct after repair) is the evidence docs/data-generation.md quotes.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from data_gen.catalogue.kinds import KINDS, classify
from data_gen.failures.mutations import mutants
from data_gen.repairs.repairers import repair
from data_gen.sources.grading import SeededGrading
from data_gen.sources.mutation import first_failure
from evaluator.grader import Evaluator
from tasks import get_task

DEFAULT_TASKS = ("softmax", "matmul", "layer_norm", "attention_fwd")


@dataclass
class RepairCheck:
    """One kind's repairer against one injector's mutants, as graded."""

    kind: str
    operator: str
    injected: int = 0   # mutants graded failing as this kind
    changed: int = 0    # of those, the repairer changed
    correct: int = 0    # of those, graded correct after the repair


def verify_repairers(tasks: list[str], per_operator: int, workers: int = 2, max_rounds: int = 3) -> list[RepairCheck]:
    """Inject each kind into the tasks' solutions, grade, apply the kind's repairer (again while
    the kernel still fails as that kind, up to `max_rounds`), and grade the result."""
    checks = []
    with Evaluator(workers=workers, n_seeds=1, stop_at_first_failure=True) as ev:
        grader = SeededGrading(ev, run_seed=0)
        for k, op in ((k, op) for k in KINDS if k.repairer for op in k.operators):
            check = RepairCheck(k.name, op)
            for name in tasks:
                task = get_task(name)
                for mutant in [m for m in mutants(task) if m.operator == op][:per_operator]:
                    mutant, verdict = first_failure(task, mutant, grader)
                    if verdict.ok or verdict.status == "pending" or classify(verdict.status, verdict.message) != k.name:
                        continue
                    check.injected += 1
                    source = mutant.code
                    for _ in range(max_rounds):
                        fixed = repair(k.repairer, source, verdict.message)
                        if fixed is None or fixed == source:
                            break
                        source = fixed
                        verdict = grader.grade(task, f"```python\n{source}\n```")
                        if verdict.ok or classify(verdict.status, verdict.message) != k.name:
                            break
                    check.changed += source != mutant.code
                    check.correct += verdict.ok
            checks.append(check)
            print(f"{check.kind:20s} {check.operator:22s} injected {check.injected:3d}  changed {check.changed:3d}  "
                  f"correct after repair {check.correct:3d}", flush=True)
    return checks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data_gen.repair_check", description=__doc__.split("\n")[0])
    p.add_argument("--task", dest="tasks", action="append", help="a task whose solution takes the bugs (repeatable)")
    p.add_argument("--per-operator", type=int, default=2, help="mutants per injector and task")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    verify_repairers(args.tasks or list(DEFAULT_TASKS), args.per_operator, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
