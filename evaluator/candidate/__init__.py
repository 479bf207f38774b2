"""The candidate as text, before anything runs: its code extracted from a model's answer
(extract), the static policy on its syntax tree and the one thread-safe parser (policy), the file
name it loads under and where in it an error happened (errors), and its block-size knobs, which
the tuner and the variant pool rewrite (knobs).

May import: nothing else of the evaluator.
"""
