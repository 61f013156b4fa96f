"""kit: turn a second-hand 2x V100 box into a private LLM server."""

__version__ = "0.1.0"
