"""The `itera-output/1` format's facts, in one place: pure data and pure functions, no I/O.

The recorder writes with them, the rules check with them, the reloader and the seal read them: where two
layers need the same fact (a name, a money rule, a layout), it lives here and both import it. Nothing here
imports another part of itera_verify except `model`.
"""
