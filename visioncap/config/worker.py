"""`visioncap worker`: how a worker shares a pipeline's cameras with the other workers by leases (PostgreSQL)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from visioncap.config.base import StrictModel


class WorkerConfig(StrictModel):
    """Leases on cameras, in the database's clock, renewed by the worker that holds them."""

    capacity: int = Field(
        default=4,
        ge=1,
        description="Most cameras this worker runs; the cameras are shared out in proportion to the capacities of "
        "the live workers.",
    )
    lease_s: float = Field(
        default=15.0,
        gt=0,
        description="How long a lease holds without renewal: a worker killed or cut off from the database loses "
        "its cameras after this, and live workers take them.",
    )
    renew_s: float = Field(
        default=3.0, gt=0, description="Seconds between rounds of renewing, claiming and releasing leases."
    )
    stop_margin_s: float = Field(
        default=2.0,
        ge=0,
        description="A worker that has not renewed stops its cameras this long before their leases expire (on its "
        "own clock), so that it never runs a camera another worker may already hold.",
    )

    @model_validator(mode="after")
    def _renewal_fits_the_lease(self) -> Self:
        if self.renew_s >= self.lease_s - self.stop_margin_s:
            raise ValueError("renew_s must be shorter than lease_s - stop_margin_s, or leases lapse between renewals")
        return self
