"""Device models: each client's compute speed, bandwidths, latency and availability, for the simulated clock
(:mod:`lightning_fed.clock`; issue #53). One scheme per module: :mod:`.base` (:class:`DeviceModel`,
:class:`DeviceProfiles`), :mod:`.parametric` (:class:`ParametricDeviceModel`), :mod:`.callable`
(:class:`CallableDeviceModel`), :mod:`.fedscale` (:class:`FedScaleDevices`: FedScale's trace files, read by
:mod:`.fedscale_files`)."""

from lightning_fed.datamodules.devices.base import DeviceModel, DeviceProfiles, as_profiles
from lightning_fed.datamodules.devices.callable import CallableDeviceModel
from lightning_fed.datamodules.devices.fedscale import FedScaleDevices
from lightning_fed.datamodules.devices.parametric import ParametricDeviceModel

__all__ = ["CallableDeviceModel", "DeviceModel", "DeviceProfiles", "FedScaleDevices", "ParametricDeviceModel",
           "as_profiles"]
