"""Local training without communication (the "Local" baseline of FedNH, App. A.2, and PerAda).

Each client trains its own model alone, starting from the common initial model, for as many rounds
as it is selected ("each client is trained for exactly the same number of rounds as its counterpart
in FedAvg", FedNH App. A.2; the official code's fixed ``int(R * participation)`` rounds is not
followed). Every parameter and buffer is personal (``personal_modules = ("",)``), so nothing is
uploaded and the server model stays the initial one: Local has no global model, and its generic
columns only show the initial model; compare its personalized ones.
"""

from __future__ import annotations

from fedpipe.algorithms.registry import register
from fedpipe.fl.strategy import Strategy


@register("local")
class Local(Strategy):
    personal_modules = ("",)
