"""The failure catalogue: the kinds of failure real models make on TPU (kinds: names, real error
texts, GPT-5.3's real counts, `classify`, the names of each kind's injectors and repairer), the
target mix of kinds a dataset is drawn towards (mix), and the count of a checkout's real failures
(checkout; `python -m data_gen.catalogue jaxbench:PATH`).

May import: nothing else of data_gen.
"""
