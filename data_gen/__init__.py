"""Fixit data generation: failing Pallas kernels turned into verified repair pairs.

The commands are this folder's top level: `python -m data_gen.collect` (collect.py: a source's
items graded, repaired, made pairs, journaled, written as a dataset), `python -m data_gen.pool`
(pool.py: the verified variant pool), `python -m data_gen.regrade` (regrade.py),
`python -m data_gen.repair_check` (repair_check.py) and `python -m data_gen.catalogue`. A collected
item walks forward through the subpackages, each one step:

- `catalogue/`: the failure kinds every step speaks of (real counts, classify, the target mix);
- `failures/`: failing kernels made from correct ones (edit engine, bug operators, mutants,
  variants, and the fingerprints and giveaways that keep a failure and its repair apart by the
  fix alone);
- `repairs/`: real failures repaired without a model (repairers, the repair search);
- `rows/`: how a confirmed repair becomes a row (explanations, pairs, text rules), the journal
  line of every attempt, and the dataset writer;
- `sources/`: where items come from (mutation, model, replay), each walking its item through the
  steps above on the seeded grading they share.

A subpackage never imports the commands; each one's docstring says which others it may import
(tests/test_architecture.py holds them to it). See docs/data-generation.md and
docs/architecture.md.
"""
