"""The case shapes two oracle suites share: the head split's and the gated norm's.

test_silu_rms_heads.py and test_norms_vjp.py take HeadSplit, test_gated_rms_norm.py and
test_norms_vjp.py take NormRows; each keeps its own list of cases.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadSplit:
    """conv_out [B, S, channels] split into q [B, S, Hk, Dk], k [B, S, Hk, Dk], v [B, S, Hv, Dv]."""
    B: int
    S: int
    Hk: int
    Hv: int
    Dk: int
    Dv: int
    dtype: str = "bfloat16"

    def __str__(self):
        return (f"B{self.B} S{self.S} Hk{self.Hk} Hv{self.Hv} Dk{self.Dk} Dv{self.Dv} "
                f"{self.dtype}")

    @property
    def channels(self):
        return 2 * self.Hk * self.Dk + self.Hv * self.Dv


@dataclass(frozen=True)
class NormRows:
    """x [*lead, D] normalized per row of D, gated by a gate of x's shape."""
    lead: tuple  # the leading dims: rows = their product
    D: int
    dtype: str = "bfloat16"
    gate_dtype: str = None  # None: x's dtype (mlx-lm's z)

    @property
    def gate(self):
        return self.gate_dtype or self.dtype

    def __str__(self):
        return f"x {self.lead + (self.D,)} {self.dtype} gate {self.gate}"
