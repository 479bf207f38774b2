"""One way to find a task, ours or imported: a name plus the suite checkouts in use.

Callers ask a `TaskResolver` and never which kind a name is. A task it returns travels to other
processes as itself (tasks.spec.Task.__reduce_ex__: an imported one is rebuilt there from its
suite), so graders on Ray actors take imported tasks like ours.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import tasks
from suites import LoadError, Suite, open_suite
from tasks.spec import Task


class TaskResolver:
    """Our registry plus the suites at `specs` (`jaxbench:PATH`, each opened here and closed by
    `close`). Imported names (`jaxbench/...`, `kernelbench-jax/...`) never clash with ours."""

    def __init__(self, specs: Sequence[str] = ()):
        self.suites: list[Suite] = []
        try:
            for spec in specs:
                self.suites.append(open_suite(spec))  # SuiteError: a bad spec, said in one line
        except BaseException:
            self.close()
            raise

    def task(self, name: str, run_reference: bool = True) -> Task:
        """The task called `name`; UnknownTaskError or LoadError (an entry that cannot be a task).
        `run_reference=False`: an imported one for the static stages only (suites.Suite.task)."""
        for suite in self.suites:
            if name in suite.entries:
                return suite.task(name, run_reference)
        return tasks.get_task(name)

    def tasks(self, names: Sequence[str] | None = None,
              on_not_loaded: Callable[[str, LoadError], None] | None = None) -> list[Task]:
        """Tasks by name; without names, every task of the suites in use (those that cannot load are
        passed to `on_not_loaded`, else said on stderr), or ours when there is no suite."""
        if names:
            return [self.task(n) for n in names]
        if not self.suites:
            return tasks.all_tasks()
        found = []
        for suite in self.suites:
            for name in suite.names():
                try:
                    found.append(suite.task(name))
                except LoadError as exc:
                    if on_not_loaded is None:
                        print(f"not loaded: {name}: {exc}", file=sys.stderr)
                    else:
                        on_not_loaded(name, exc)
        return found

    def close(self) -> None:
        for suite in self.suites:
            suite.close()

    def __enter__(self) -> "TaskResolver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
