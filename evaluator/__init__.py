"""The evaluator: turns (task, candidate source) into a verdict. Stages: evaluator/stages.py."""
