"""headstart: LLM serving for interactive text-to-SQL that prefills while the user types."""

__version__ = "0.1.0"
