"""Device models: each client's compute speed, bandwidths, latency and availability, for the simulated clock
(:mod:`lightning_fed.clock`; issue #53). One scheme per module: :mod:`.base` (:class:`DeviceModel`,
:class:`DeviceProfiles`), :mod:`.parametric` (:class:`ParametricDeviceModel`), :mod:`.callable`
(:class:`CallableDeviceModel`)."""

from lightning_fed.datamodules.devices.base import DeviceModel, DeviceProfiles, as_profiles
from lightning_fed.datamodules.devices.callable import CallableDeviceModel
from lightning_fed.datamodules.devices.parametric import ParametricDeviceModel

__all__ = ["CallableDeviceModel", "DeviceModel", "DeviceProfiles", "ParametricDeviceModel", "as_profiles"]
