"""The profile of every device type of a catalog: measured tables where the catalog has them, the
spec roofline elsewhere (the two :class:`planner.cost.profile.DeviceProfile` sources), each with the
cost-model terms of its own type (a calibration applies to the GPU types it was measured on, not
to every device of a cluster that holds one of them: issue 31)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from planner.catalog import Catalog, DeviceType, default_catalog
from planner.cost.measured import MeasuredProfile
from planner.cost.measured_tables import timed_cast_once
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile import DeviceProfile, SpecProfile
from planner.plan import PlanOptions


class ProfileSet:
    """Profiles of every device type, built on demand from a catalog.

    A catalog entry with a usable ``measured`` section gets a ``MeasuredProfile`` (unless
    ``prefer_measured=False``); every other entry a ``SpecProfile``.

    ``params`` are the terms of every type without its own; ``by_type`` (GPU type as the cluster
    names it, or catalog key -> terms) those of calibrated types; ``terms`` (same keys -> a short
    label, e.g. ``packaged calibration 'h100' (2026-11-20)``) says where each came from, for the
    plan file. Device terms (compute, memory overhead) come from :meth:`params_for`; terms of links
    and collectives that several types share from :meth:`shared`."""

    def __init__(self, catalog: Catalog | None = None, params: CostParams = DEFAULT_PARAMS,
                 prefer_measured: bool = True, by_type: Mapping[str, CostParams] | None = None,
                 terms: Mapping[str, str] | None = None, default_terms: str = "default terms"):
        self.catalog = catalog or default_catalog()
        self.params = params
        self.prefer_measured = prefer_measured
        self.by_type = dict(by_type or {})
        self.terms = dict(terms or {})
        self.default_terms = default_terms
        self._profiles: dict[str, DeviceProfile] = {}
        self._variants: dict[tuple[object, ...], ProfileSet] = {}

    def for_options(self, options: PlanOptions) -> ProfileSet:
        """This set as a plan with ``options`` is costed: the residual stream inside the layers in
        the compute dtype when ``options.residual_dtype`` says so, compiled layers when
        ``options.compile`` does (the same set otherwise)."""
        low, compiled = options.residual_dtype != "fp32", options.compile
        params = replace(self.params, residual_in_compute_dtype=low, layers_compiled=compiled)
        by_type = {k: replace(v, residual_in_compute_dtype=low, layers_compiled=compiled)
                   for k, v in self.by_type.items()}
        if params == self.params and by_type == self.by_type:
            return self
        key = (params, tuple(sorted(by_type.items(), key=lambda kv: kv[0])))
        if key not in self._variants:
            self._variants[key] = ProfileSet(self.catalog, params, self.prefer_measured, by_type, self.terms,
                                             self.default_terms)
        return self._variants[key]

    def params_for(self, gpu: str) -> CostParams:
        """The cost-model terms of devices of type ``gpu`` (its calibration, else ``params``)."""
        hit = self.by_type.get(gpu)
        if hit is None and self.by_type:
            hit = self.by_type.get(self.catalog.get(gpu).key)
        return self.params if hit is None else hit

    def terms_of(self, gpu: str) -> str:
        """Where the terms of ``gpu`` come from (a calibration's name, or the default)."""
        hit = self.terms.get(gpu)
        if hit is None and self.terms:
            hit = self.terms.get(self.catalog.get(gpu).key)
        return self.default_terms if hit is None else hit

    def narrowed(self, gpus: Iterable[str]) -> ProfileSet:
        """This set with :meth:`shared` of ``gpus`` as its default terms (what a plan using only
        those types is costed with; the set itself when they agree with the default)."""
        params = self.shared(gpus)
        if params == self.params:
            return self
        key = ("narrowed", params)
        if key not in self._variants:
            self._variants[key] = ProfileSet(self.catalog, params, self.prefer_measured, self.by_type, self.terms,
                                             self.default_terms)
        return self._variants[key]

    def shared(self, gpus: Iterable[str]) -> CostParams:
        """Terms for what devices of all of ``gpus`` do together (links, collectives, the gradient
        sync): theirs when they all have the same, else ``params``. A plan passes its own devices'
        types, so a device it does not use cannot change them."""
        found = {self.params_for(g) for g in set(gpus)}
        return found.pop() if len(found) == 1 else self.params

    def _measured_entry(self, device: DeviceType) -> DeviceType | None:
        """The measured entry to use for ``device``: the profiler's profile of that type on this host,
        named ``<key>-measured`` by convention (so a cluster that says ``gpu: h100-sxm`` is planned with
        the measured H100 tables once they exist, and ``gpu: h100-sxm-mps50`` with
        ``h100-sxm-mps50-measured`` once ``calibrate --sm-percent 50`` wrote it: a host's own share
        goes before a shipped share profile from another host), else its own ``measured`` section."""
        if not self.prefer_measured:
            return None
        twin_key = f"{device.key}-measured"
        if twin_key in self.catalog:
            twin = self.catalog.get(twin_key)
            if twin.measured and twin.base == (device.base or device.key) and _share(twin) == _share(device):
                return twin
        return device if device.measured else None

    def memory_twin(self, device: DeviceType) -> DeviceType | None:
        """For an MPS share (``sm_percent`` < 100) measured before the fused RMSNorm (no
        ``meta.fused_rms_norm``): the newest full-SM measured entry of the same ``base`` that was
        measured with it — this host's ``hexiscale calibrate`` entry when there is one — whose
        activation bytes price the share's memory. A layer keeps the same tensors whatever share of
        the SMs runs it; the shipped share profiles count the norms' fp32 outputs the executor no
        longer saves (4x H200, 2026-11-26: MPS devices over-predicted 5-12 % where the full-SM GPUs
        of the same plans were within 1 %), which refused micro-batches that fit. None otherwise."""
        if device.sm_percent in (None, 100.0) or device.base is None or _fused(device):
            return None
        return _newest(e for e in self.catalog.entries if e.measured and e.base == device.base
                       and e.sm_percent in (None, 100.0) and _fused(e))

    def share_twins(self, device: DeviceType) -> list[DeviceType]:
        """For a whole GPU: the MPS shares of it timed beside it — the newest measured entry of each
        share (``sm_percent`` < 100) of the same ``base``, the same GPU model, driver and torch, the
        same executor path (fused RMSNorm, cast-once weights) — whose times bound the whole GPU's
        from above (:mod:`planner.cost.measured` rule 7). Empty for a share or without such entries."""
        if device.sm_percent not in (None, 100.0) or device.base is None or _meta(device).get("gpu_name") is None:
            return []
        kind = _timed_alike(device)
        shares: dict[float, list[DeviceType]] = {}
        for entry in self.catalog.entries:
            if entry.measured and entry.base == device.base and _share(entry) < 100.0 and _timed_alike(entry) == kind:
                shares.setdefault(_share(entry), []).append(entry)
        return [e for k in sorted(shares) if (e := _newest(shares[k])) is not None]

    def get(self, gpu: str) -> DeviceProfile:
        """Profile of a device type (catalog key or alias)."""
        prof = self._profiles.get(gpu)
        if prof is None:
            device = self.catalog.get(gpu)
            measured = self._measured_entry(device)
            params = self.params_for(gpu)
            if measured is not None:
                twin = self.memory_twin(measured)
                memory = MeasuredProfile(twin, params) if twin else None
                prof = MeasuredProfile(measured, params, memory)  # its tables checked before its twins are sought
                shares = [MeasuredProfile(s, params) for s in self.share_twins(measured)]
                if shares:
                    prof = MeasuredProfile(measured, params, memory, shares)
            else:
                prof = SpecProfile(device, params)
            self._profiles[gpu] = self._profiles[device.key] = prof
        return prof


def _share(device: DeviceType) -> float:
    """The share of its SMs ``device`` was measured with, in percent (100: the whole GPU)."""
    return 100.0 if device.sm_percent is None else device.sm_percent


def _meta(device: DeviceType) -> Mapping[str, Any]:
    """The measured section's ``meta`` (empty where it is not a mapping: parsing the tables says so)."""
    meta = (device.measured or {}).get("meta")
    return meta if isinstance(meta, Mapping) else {}


def _timed_alike(device: DeviceType) -> tuple[Any, ...]:
    """What two measured entries share when timed by the same software on the same GPU model."""
    meta = _meta(device)
    return (meta.get("gpu_name"), meta.get("driver"), meta.get("torch"), _fused(device),
            timed_cast_once(device.measured or {}))


def _newest(entries: Iterable[DeviceType]) -> DeviceType | None:
    """The entry measured last (``meta.date``), or None."""
    return max(entries, key=lambda e: str(_meta(e).get("date", "")), default=None)


def _fused(device: DeviceType) -> bool:
    """Whether ``device``'s tables were measured with the fused RMSNorm (its ``meta`` says so)."""
    return _meta(device).get("fused_rms_norm") is True
