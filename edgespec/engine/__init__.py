"""The decoder: :class:`~edgespec.engine.decoder.SpecDecoder` (loading, the round, generation) and its
options. Imports every layer below (core, io, draft, control)."""
