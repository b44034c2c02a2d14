"""`python -m strata [flags]`: what `strata-info [flags]` prints (it runs the same binary)."""

from ._tools import strata_info

strata_info()
