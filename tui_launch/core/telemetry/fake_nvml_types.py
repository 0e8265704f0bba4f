"""nvidia-ml-py's constants, error classes and structures, for :mod:`.fake_nvml`.

Built as the real module builds them: ``NVMLError(code)`` returns an instance of the code's
subclass, the subclasses are named from the ``NVML_ERROR_*`` constants
(``NVML_ERROR_GPU_IS_LOST`` -> ``NVMLError_GpuIsLost``), and the structures have the real
ones' fields. :mod:`.fake_nvml` re-exports every name here (``__all__``).
"""

from __future__ import annotations

import ctypes
import string
import sys
from dataclasses import dataclass
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1


class NVMLError(Exception):
    """As nvidia-ml-py: ``NVMLError(code)`` returns an instance of the code's subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    __hash__ = Exception.__hash__


def _make_error_classes() -> None:
    # The same names as nvidia-ml-py's: NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost.
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        words = string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        value = getattr(module, name)

        def new(cls: type, *args: Any, _v: int = value) -> NVMLError:
            return NVMLError.__new__(cls, _v)

        cls = type(f"NVMLError_{words}", (NVMLError,), {"__new__": new})
        cls.__module__ = __name__
        setattr(module, cls.__name__, cls)
        NVMLError._valClassMapping[value] = cls


_make_error_classes()
# Spelled out for type checkers and readers; _make_error_classes made them.
NVMLError_Uninitialized: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_UNINITIALIZED]
NVMLError_NotSupported: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_NOT_SUPPORTED]
NVMLError_NoPermission: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_NO_PERMISSION]
NVMLError_NotFound: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_NOT_FOUND]
NVMLError_LibraryNotFound: type[NVMLError] = NVMLError._valClassMapping[
    NVML_ERROR_LIBRARY_NOT_FOUND
]
NVMLError_DriverNotLoaded: type[NVMLError] = NVMLError._valClassMapping[
    NVML_ERROR_DRIVER_NOT_LOADED
]
NVMLError_GpuIsLost: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_GPU_IS_LOST]


def nvmlErrorString(result: int) -> str:
    """The error's text, as the real library gives it."""
    return NVMLError._errcode_to_string.get(result, "Unknown Error")


# ----------------------------------------------------------------- structures (as nvidia-ml-py)


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlProcessUtilizationSample_t(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class nvmlFriendlyObject:
    """What nvidia-ml-py returns for process-list entries: the struct's fields as attributes."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for k, v in dictionary.items():
            setattr(self, k, v)

    def __str__(self) -> str:
        return str(self.__dict__)


@dataclass(frozen=True)
class c_nvmlDevice_t:
    """A device handle (the real one is an opaque pointer)."""

    index: int
    mig: int | None = None


__all__ = sorted(n for n in dir() if n.startswith(("NVML", "nvml", "c_nvml")))
