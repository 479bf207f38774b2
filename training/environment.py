"""A kernel-writing environment in the gym shape (`reset()` / `step(answer)`), driven by any RL loop.

One episode is one task on one split: the observation is the conversation so far (system
prompt and task prompt, built exactly as `training.rebench` builds them; then each failing
answer and the evaluator's feedback on it, as in a Fixit row), an action is a model's answer,
and a step grades it. The episode ends on a correct answer or after `max_turns` answers. The
reward is training/reward.py's; TRL's GRPOTrainer drives it through training/rl.py, a plain
loop drives it in tests/test_rl.py.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from evaluator.record import Verdict
from training.reward import RewardSpec


@dataclass
class Step:
    """What `step` returns: the next observation (the conversation with the feedback appended;
    None once the episode is over), this answer's reward, whether the episode is over, and the
    verdict the reward came from."""

    observation: list[dict[str, str]] | None
    reward: float
    done: bool
    verdict: Verdict


@dataclass
class Episode:
    """One task's conversation so far."""

    task: Any
    split: str
    messages: list[dict[str, str]]
    rewards: list[float] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def turn(self) -> int:
        return len(self.rewards)


class KernelEnv:
    """`reset(task)` starts an episode and returns its first observation; `step(answer)` grades
    the answer against the episode's task and split."""

    def __init__(self, evaluator: Any, tasks: list[Any], split: str = "train", max_turns: int = 1,
                 reward: RewardSpec = RewardSpec(), context: str = "none", generation: str | None = None,
                 seed: int = 0):
        """`evaluator`: an evaluator.grader.Evaluator (any object with its `grade`); `tasks`: what
        `reset()` without a task draws from; `generation`: the TPU the prompt names (the
        evaluator's by default)."""
        if not tasks:
            raise ValueError("the environment needs at least one task")
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.evaluator, self.tasks, self.split, self.max_turns = evaluator, list(tasks), split, max_turns
        self.reward_spec, self.context = reward, context
        self.generation = generation or evaluator.generation.name
        self.episode: Episode | None = None
        self._rng = random.Random(seed)

    def first_messages(self, task: Any) -> list[dict[str, str]]:
        """An episode's first observation for `task` (what rebench asks first)."""
        from chat.prompts import task_messages

        return task_messages(task, self.context, self.generation, split=self.split, evaluation=True)

    def reset(self, task: Any | None = None) -> list[dict[str, str]]:
        """Start an episode on `task` (a Task or a name of one of `tasks`), else on a random one."""
        if task is None:
            task = self._rng.choice(self.tasks)
        elif isinstance(task, str):
            task = self.task_named(task)
        self.episode = Episode(task, self.split, self.first_messages(task))
        return list(self.episode.messages)

    def task_named(self, name: str) -> Any:
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(f"task {name!r} is not one of this environment's: {', '.join(t.name for t in self.tasks)}")

    def step(self, answer: str) -> Step:
        """Grade `answer`; the next observation carries the evaluator's feedback on it."""
        episode = self.episode
        if episode is None or self.done:
            raise RuntimeError("step() before reset(), or after the episode ended")
        verdict = self.evaluator.grade(episode.task, answer, episode.split)
        return self.record(answer, verdict)

    def record(self, answer: str, verdict: Verdict) -> Step:
        """Take a verdict reached elsewhere (graded in a batch) as this episode's next step."""
        from chat.prompts import repair_messages

        episode = self.episode
        assert episode is not None
        reward = self.reward_spec.reward(verdict)
        episode.rewards.append(reward)
        episode.verdicts.append(verdict)
        if self.done:
            return Step(None, reward, True, verdict)
        episode.messages = repair_messages(episode.messages, answer, verdict)
        return Step(list(episode.messages), reward, False, verdict)

    @property
    def done(self) -> bool:
        episode = self.episode
        return episode is not None and bool(episode.verdicts) and (
            episode.verdicts[-1].ok or episode.turn >= self.max_turns)

    def episode_return(self) -> float:
        """The episode's discounted return (training/reward.py)."""
        assert self.episode is not None
        return self.reward_spec.discounted_return(self.episode.rewards)
