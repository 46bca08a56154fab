"""The tool's version and the package format it reads: imported by every layer (the report records them)."""
__version__ = "0.2.0"
FORMAT = "itera-output/1"
