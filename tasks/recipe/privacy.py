"""``[fleet.privacy]``: differential privacy of a fleet's updates, per board (board-level DP: two
fleets differing by one board's whole data are hard to tell apart from what is released).

Each board's update (its trained tensors minus the round's global ones, all trained tensors as one
vector) is clipped to L2 norm ``clip`` and Gaussian noise of standard deviation
``noise_multiplier * clip`` is added: by the host to the sum of the clipped updates (``central``,
which then divides by the count) or by each board to its own update before it leaves the board
(``local``: the host never sees a raw update). ε for the stated ``delta`` after each round comes
from an RDP accountant (:mod:`tasks.fleet.privacy`); the fleet flow runs no round that would take
it past ``target_epsilon``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tasks.recipe.fields import Number, recipe_table

PrivacyMode = Literal["central", "local"]


@recipe_table("fleet.privacy")
class PrivacySpec:
    """``[fleet.privacy]``: clipping, Gaussian noise and the privacy budget of a fleet run."""

    target_epsilon: Number = Field(
        gt=0, le=1000, description="ε budget for the whole run: no round is run that would exceed it"
    )
    delta: Number = Field(gt=0, lt=1, description="δ of the (ε, δ) guarantee (well below 1 / boards)")
    clip: Number = Field(gt=0, le=1e6, description="L2 norm each board's update is clipped to")
    noise_multiplier: Number = Field(
        gt=0, le=1000, description="Gaussian noise standard deviation, in units of clip"
    )
    mode: PrivacyMode = Field(
        "central",
        description="central: the host noises the mean of the clipped updates | local: each board "
        "clips and noises its own update before it leaves (the host never sees a raw one)",
    )
