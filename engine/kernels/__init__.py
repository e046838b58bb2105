"""The CPU numerics of packed targets: packed4.py (the GGUF's 4-bit layers), siblings.py (a
layer's sibling products run as one), qmm.py and rowattn.py with their C sources and C++ ops
(qmm.c, rowattn.c, ops.cpp, found beside them by path), eager_bits.py (the eager step's bits
in a compiled one), attention.py (the engine's registered attention), layout.py (oneDNN-
packed weights for few-token forwards), vocab.py with vocab.c (a round's vocabulary reads of
a logits row in one call each), ngram.py with ngram.c (the n-gram drafter's law in one call)
and threads.py (the thread rule). It imports only engine.core, whose import has fixed
inductor's cache folder before any op here registers."""
