"""The speculative round's pure parts: its typed data, sampling and the acceptance rule, token trees, the Gumbel
coupling, logits processors and grammars, and the generation statistics. Imports nothing else of edgespec but
:mod:`edgespec.errors`."""
