"""Fixit data generation: failing Pallas kernels turned into verified repair pairs.

`python -m data_gen.collect` (collect.py) runs a source (sources.py: injected bugs from
mutations.py, with the operators of operators.py written in by edits.py; a model's answers
through chat/models.py; or a replayed file) through the evaluator,
journals every result (journal.py), builds pairs (pairs.py, with chat/prompts.py and chat/context.py;
explanations of injected bugs from explanations.py, checked by text_rules.py) and writes the dataset
(dataset.py, with the published failure mix of mix.py). The mutation source's correct kernels come from the verified variant pool
(`python -m data_gen.pool`, pool.py; candidates from variants.py), and kernels are counted as
distinct by fingerprint.py. See docs/data-generation.md.
"""
