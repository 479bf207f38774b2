"""Fixit data generation: failing Pallas kernels turned into verified repair pairs.

`python -m data_gen.collect` (collect.py) runs a source (sources.py: injected bugs from
mutations.py, a model's answers through chat/models.py, or a replayed file) through the evaluator,
journals every result (journal.py), builds pairs (pairs.py, with chat/prompts.py and chat/context.py) and writes
the dataset (dataset.py). See docs/data-generation.md.
"""
