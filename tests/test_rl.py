"""RL on the grader: the reward table, the environment driven by a plain loop, multi-turn rollouts,
`python -m training.rl` (tiny offline run, resume, bad input) and a reward moving a policy."""
import json
import math

import pytest

from evaluator.record import STATUSES, Status, Verdict
from tests.conftest import ROOT, require_module
from training.reward import HACK_STATUSES, RewardSpec

SPEC = RewardSpec()


def verdict(status: str, speedup: float | None = None, predicted: float | None = None) -> Verdict:
    return Verdict(task="softmax", task_version=1, status=status, message="", backend="tpu-interpret",
                   split="train", stage="run", speedup=speedup,
                   predicted_speedup={"overall": predicted} if predicted is not None else None)


# --- the reward table ------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [s for s in STATUSES if s != "correct"])
def test_every_status_but_correct_is_worth_nothing(status):
    assert SPEC.reward(verdict(status, speedup=3.0, predicted=3.0)) == 0.0


def test_a_correct_kernel_earns_one_plus_a_capped_log_speed_term():
    assert SPEC.reward(verdict("correct")) == 1.0  # no speed figure: no speed term
    assert SPEC.reward(verdict("correct", predicted=2.0)) == pytest.approx(1.25)
    assert SPEC.reward(verdict("correct", predicted=0.5)) == pytest.approx(0.75)
    assert SPEC.reward(verdict("correct", predicted=100.0)) == SPEC.reward(verdict("correct", predicted=4.0))
    assert SPEC.reward(verdict("correct", predicted=1e-6)) == pytest.approx(SPEC.min_correct) and SPEC.min_correct > 0
    # a measured speedup (a TPU ran it) outranks the prediction
    assert SPEC.reward(verdict("correct", speedup=0.5, predicted=4.0)) == pytest.approx(0.75)
    assert SPEC.reward(verdict("correct", predicted=float("nan"))) == 1.0


def test_a_reward_that_could_pay_a_slow_kernel_nothing_is_refused():
    with pytest.raises(ValueError, match="worth no more than a failure"):
        RewardSpec(speed_weight=0.5, speed_cap=4.0)
    with pytest.raises(ValueError, match="gamma"):
        RewardSpec(gamma=0.0)


def test_an_episode_return_discounts_later_turns():
    spec = RewardSpec(gamma=0.4)
    assert spec.discounted_return([0.0, 0.0, 1.0]) == pytest.approx(0.16)
    assert spec.discounted_return([1.25]) == 1.25
    assert spec.discounted_return([0.0, 1.0]) < spec.discounted_return([1.0])
    assert RewardSpec(gamma=1.0).discounted_return([0.0, 1.0]) == 1.0


def test_hacks_are_the_anti_cheat_refusals():
    assert {str(s) for s in HACK_STATUSES} <= set(STATUSES)
    assert Status.WORK_OUTSIDE_KERNEL in HACK_STATUSES and Status.WRONG_OUTPUT not in HACK_STATUSES


# --- the environment, driven by a plain loop -------------------------------------------------------
def test_a_plain_loop_drives_an_episode_to_a_correct_answer(evaluator):
    from chat.prompts import task_messages
    from tasks import get_task
    from training.environment import KernelEnv

    task = get_task("softmax")
    env = KernelEnv(evaluator, [task], max_turns=3, reward=RewardSpec(gamma=0.5))
    observation = env.reset("softmax")
    assert observation == task_messages(task, "none", evaluator.generation.name, evaluation=True)
    answers = ["I would rather not write code today.", f"```python\n{task.solution_source()}\n```"]
    rewards = []
    while not env.done:
        step = env.step(answers[env.episode.turn])
        rewards.append(step.reward)
        if not step.done:  # the next observation carries the evaluator's feedback
            assert step.observation[-2] == {"role": "assistant", "content": answers[0]}
            assert "The evaluator rejected this kernel" in step.observation[-1]["content"]
    assert [v.status for v in env.episode.verdicts] == ["extraction_error", "correct"]
    assert rewards[0] == 0.0 and rewards[1] >= SPEC.min_correct
    assert env.episode_return() == pytest.approx(0.5 * rewards[1])
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("more")


def test_an_episode_ends_after_max_turns_and_reset_draws_a_task(evaluator):
    from tasks import get_task
    from training.environment import KernelEnv

    env = KernelEnv(evaluator, [get_task("softmax"), get_task("rms_norm")], max_turns=2, seed=1)
    env.reset()
    assert env.episode.task.name in ("softmax", "rms_norm")
    assert not env.step("no code").done and env.step("still none").done
    with pytest.raises(KeyError, match="not one of this environment's"):
        env.reset("matmul")


# --- multi-turn rollouts: the tokens between two answers ---------------------------------------------
@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    require_module("transformers", "pip install -e '.[train]'")
    from training.tiny_model import train_tokenizer

    return train_tokenizer(["The evaluator rejected this kernel. ```python\nx = 1\n```"] * 20, vocab_size=300)


def test_feedback_tokens_join_two_answers_into_the_conversation_the_model_reads(tiny_tokenizer):
    from chat.prompts import repair_messages
    from training.rl import feedback_ids, render_ids

    head = [{"role": "system", "content": "sys"}, {"role": "user", "content": "write it"}]
    answer = "```python\nx = 1\n```"
    generated = tiny_tokenizer(answer, add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    after = repair_messages(head, answer, verdict("wrong_output"))
    joined = render_ids(tiny_tokenizer, head) + generated + feedback_ids(tiny_tokenizer, head, answer, after, True)
    assert tiny_tokenizer.decode(joined) == tiny_tokenizer.apply_chat_template(
        after, tokenize=False, add_generation_prompt=True)
    # an answer cut off before its end-of-turn token gets one from the markup
    cut = render_ids(tiny_tokenizer, head) + generated[:-1] + feedback_ids(tiny_tokenizer, head, answer, after, False)
    assert tiny_tokenizer.decode(cut) == tiny_tokenizer.decode(joined)


# --- python -m training.rl -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rl_config(tmp_path_factory):
    """configs/grpo-tiny.yaml with its outputs under a folder of this test module."""
    for module in ("torch", "trl", "peft"):
        require_module(module, "pip install -e '.[train]'")
    import yaml

    root = tmp_path_factory.mktemp("rl")
    config = yaml.safe_load((ROOT / "configs" / "grpo-tiny.yaml").read_text())
    config.update(model_name_or_path=str(root / "model"), output_dir=str(root / "out"),
                  verdict_cache=str(root / "verdicts"))
    path = root / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_the_tiny_run_trains_resumes_and_writes_log_plot_adapter_and_lift(rl_config, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from training.rl import main

    out = rl_config.parent / "out"
    assert main(["--config", str(rl_config), "--max_steps", "1", "--rebench", "false"]) == 0
    assert [r["step"] for r in map(json.loads, (out / "rl_log.jsonl").read_text().splitlines())] == [0]
    assert (out / "checkpoint-1").is_dir() and not (out / "lift.md").exists()
    # resumed from its checkpoint: one more step, the log continues without repeating a step
    assert main(["--config", str(rl_config), "--max_steps", "2", "--resume_from_checkpoint", "true"]) == 0
    rows = [json.loads(line) for line in (out / "rl_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:  # 2 prompts x 4 generations, each episode up to 2 answers, graded for real
        assert row["episodes"] == 4 and row["answers"] == 8 and sum(row["statuses"].values()) == 8
        assert 0.0 <= row["correct_rate"] <= 1.0 and 0.0 <= row["hack_rate"] <= 1.0
    summary = json.loads((out / "rl_summary.json").read_text())
    assert summary["steps"] == 2 and len(summary["rollouts"]) == 2
    for name in ("adapter_model.safetensors", "adapter_config.json", "reward_curve.png", "lift.md"):
        assert (out / name).is_file(), name
    lift = (out / "lift.md").read_text()
    assert "held-out tasks" in lift and "add_layernorm" in lift and "tuned" in lift
    assert "saved to" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "no_such_task"], "no_such_task"),
    (["--tasks", "add_layernorm"], "held-out tasks are for the re-benchmark"),
    (["--model_name_or_path", "/nowhere/model", "--build_tiny_model", "false"], "does not exist"),
    (["--model_name_or_path", "nobody/no-such-model", "--build_tiny_model", "false"], "HF_HUB_OFFLINE is set"),
    (["--speed_weight", "2.0"], "worth no more than a failure"),
    (["--ray_address", "127.0.0.1:1"], "cannot reach the Ray cluster"),
    (["--no_such_key", "1"], "no_such_key"),
])
def test_bad_input_is_one_line_and_exit_2(rl_config, capsys, monkeypatch, extra, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if "--ray_address" in extra:
        require_module("ray", "pip install -e '.[ray]'")
    from training.rl import main

    try:
        code = main(["--config", str(rl_config), *extra])
    except SystemExit as exc:  # argparse's own refusal of an unknown flag
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) <= 2, err


def test_a_config_missing_its_model_is_one_line(tmp_path, capsys):
    from training.rl import main

    config = tmp_path / "bare.yaml"
    config.write_text("output_dir: " + str(tmp_path / "out") + "\nuse_cpu: true\nreport_to: none\n")
    assert main(["--config", str(config)]) == 2
    assert "no model: set model_name_or_path" in capsys.readouterr().err


# --- the reward signal moves a policy --------------------------------------------------------------
@pytest.mark.slow
def test_grpo_on_the_grader_raises_the_probability_of_a_correct_kernel(tmp_path, monkeypatch):
    """A tiny model that writes, with even odds, transpose_2d's kernel or the same kernel with the
    output block index swapped (wrong values): GRPO steps with rewards from the real grader
    make the correct kernel more likely and the wrong one less."""
    for module in ("torch", "trl", "peft"):
        require_module(module, "pip install -e '.[train]'")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from tests.rl_toy import ToyPolicy

    toy = ToyPolicy.build(tmp_path)
    before = toy.log_probs()
    assert abs(before["correct"] - before["wrong"]) < math.log(4), before  # both are likely
    toy.grpo(steps=6)
    after = toy.log_probs(adapter=True)
    assert after["correct"] > before["correct"] + 0.3 and after["wrong"] < before["wrong"], (before, after)
    assert {"correct", "runtime_error"} <= toy.statuses_seen()  # graded for real, both ways


def test_the_gpu_recipe_parses():
    """configs/grpo.yaml's keys are all known (on this CPU machine only bf16 is overridden)."""
    require_module("trl", "pip install -e '.[train]'")
    from training.rl import make_parser

    script_args, training_args, _ = make_parser().parse_args_and_config(
        ["--config", str(ROOT / "configs" / "grpo.yaml"), "--bf16", "false", "--use_cpu", "true"])
    assert training_args.use_vllm and script_args.ray_address == "auto" and script_args.max_turns == 2
