"""Failing kernels made from verified correct ones: the edit engine (edits), the bug operators
and their site finders, bound to the catalogue's kinds (operators), mutants of a kernel and
compounds of two bugs (mutations), the correct kernels of each task (variants), and the checks
that a failing kernel differs from its repair by the fix alone (fingerprint, giveaways), which
the dataset's rules reuse.

May import: data_gen.catalogue.
"""
