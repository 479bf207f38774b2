"""Where collected items come from, and each item's walk forward: mutants of verified kernels
(mutation), a model's own answers with a repair loop (model), real attempts replayed (replay),
all graded on the seeded train split they share (grading). Each source's `process` takes one
item through the steps below it: verdict, repair, pair and row rules, journal line.

May import: data_gen.catalogue, data_gen.failures, data_gen.repairs, data_gen.rows.
"""
