"""One bound on the work of scanning a whole package's pickles: decompressed bytes and walked opcodes.

A 632-byte zstd file can hold 20 million opcodes, and thirty of them fit in a 1 MB archive: scanned one by one
without a common bound, they stall an audit for hours. Every scan of a package draws on one Budget, in units
of bytes: each decompressed or searched byte costs one, each opcode walked OPCODE_UNITS (walking one takes
about as long as hashing a few hundred bytes). The audit sizes it by --max-size, `verify` by the
package's own size; a scan that runs out of it stops, and its file is IV506 "cannot be scanned".
"""
from __future__ import annotations

OPCODE_UNITS = 256  # per opcode walked: 1 GiB walks 4 M opcodes (~7 s); a 7B model's optimizer.pt holds ~20 k
DEFAULT_UNITS = 1 << 30  # a scan with no package around it (one file, one DCP slice); a package's least


class BudgetSpent(RuntimeError):
    """The package's scan budget is spent: the file being scanned cannot be judged."""


class Budget:
    def __init__(self, units: int = DEFAULT_UNITS):
        self.limit = self.left = int(units)

    def spend(self, units: int) -> None:
        self.left -= units
        if self.left < 0:
            raise BudgetSpent(f"the scan's budget of {self.limit} units (decompressed bytes, opcodes × "
                              f"{OPCODE_UNITS}; set by --max-size) is spent")
