"""Real failures repaired without a model: one mechanical repairer per failure kind
(repairers), and the search that applies them as each verdict directs, graded after each edit
(repair_search).

May import: data_gen.catalogue, data_gen.failures.
"""
