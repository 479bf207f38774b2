"""How a confirmed repair becomes a dataset row: the explanation of what was observed
(explanations), the five-message Fixit pair (pairs), the rules on its model-facing text
(text_rules), the journal line of every attempt with the reason it gave no pair (journal), and
the dataset written from the kept pairs: dedupe, decontaminate, balance, split, card (dataset).

May import: data_gen.catalogue, data_gen.failures.
"""
