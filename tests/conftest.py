"""Test-wide settings, applied before numba or torch load.

OpenMP threads spin while they wait by default; on a busy two-core machine (CI) that makes
small parallel kernels and torch loops many times slower. Passive waiting changes no result.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
