"""The profile of every device type of a catalog: measured tables where the catalog has them, the
spec roofline elsewhere (the two :class:`planner.cost.profile.DeviceProfile` sources)."""

from __future__ import annotations

from dataclasses import replace

from planner.catalog import Catalog, DeviceType, default_catalog
from planner.cost.measured import MeasuredProfile
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile import DeviceProfile, SpecProfile
from planner.plan import PlanOptions


class ProfileSet:
    """Profiles of every device type, built on demand from a catalog.

    A catalog entry with a usable ``measured`` section gets a ``MeasuredProfile`` (unless
    ``prefer_measured=False``); every other entry a ``SpecProfile``."""

    def __init__(self, catalog: Catalog | None = None, params: CostParams = DEFAULT_PARAMS,
                 prefer_measured: bool = True):
        self.catalog = catalog or default_catalog()
        self.params = params
        self.prefer_measured = prefer_measured
        self._profiles: dict[str, DeviceProfile] = {}
        self._variants: dict[CostParams, ProfileSet] = {}

    def for_options(self, options: PlanOptions) -> ProfileSet:
        """This set as a plan with ``options`` is costed: the residual stream inside the layers in
        the compute dtype when ``options.residual_dtype`` says so (the same set otherwise)."""
        params = replace(self.params, residual_in_compute_dtype=options.residual_dtype != "fp32")
        if params == self.params:
            return self
        if params not in self._variants:
            self._variants[params] = ProfileSet(self.catalog, params, self.prefer_measured)
        return self._variants[params]

    def _measured_entry(self, device: DeviceType) -> DeviceType | None:
        """The measured entry to use for ``device``: its own ``measured`` section, else the profiler's
        full-SM profile of that type, named ``<key>-measured`` by convention (so a cluster that says
        ``gpu: h100-sxm`` is planned with the measured H100 tables once they exist)."""
        if not self.prefer_measured:
            return None
        if device.measured:
            return device
        twin_key = f"{device.key}-measured"
        if twin_key in self.catalog:
            twin = self.catalog.get(twin_key)
            if twin.measured and twin.base == device.key and twin.sm_percent in (None, 100.0):
                return twin
        return None

    def get(self, gpu: str) -> DeviceProfile:
        """Profile of a device type (catalog key or alias)."""
        prof = self._profiles.get(gpu)
        if prof is None:
            device = self.catalog.get(gpu)
            measured = self._measured_entry(device)
            if measured is not None:
                prof = MeasuredProfile(measured, self.params)
            else:
                prof = SpecProfile(device, self.params)
            self._profiles[gpu] = self._profiles[device.key] = prof
        return prof
