"""What the device can do, measured rather than assumed.

``probe()`` reports the device type, name, compute capability and memory, and for
each of fp32 / tf32 / bf16 / fp16 whether it is supported and whether it is
*fast* or *emulated*, decided by a short matmul micro-benchmark. Capability
flags alone mislead: a CPU may compute fp16 at 1 GFLOP/s through emulation
(140x slower than fp32 on an AMD EPYC without AVX512-FP16) while bf16 runs at
three times the fp32 rate. The result is cached per machine, device and torch
version in the user cache directory (``MIXPREC_CACHE_DIR`` overrides it).

On a CPU the probe times on one thread in CPU time (:mod:`mixprec.device.clock`), so other
processes on the machine cannot move its classes; on a GPU, with CUDA events. Where its
rounds still cannot decide, decisions use what the hardware states
(:meth:`Hardware.effective`, :func:`stated`), labelled "not measured".

The probe restores every global torch flag it changes.

``MIXPREC_PROBE_FILE`` names a recorded description to use instead of measuring (what
``mixprec env --json`` prints, or a list of :meth:`Hardware.to_dict` objects, one per
device type): decisions made on a CI runner, or for a machine recorded elsewhere, then
follow that machine rather than the one they run on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mixprec._atomic import write_text
from mixprec._quote import quote
from mixprec.device.clock import clock_for, one_thread
from mixprec.device.stated import stated
from mixprec.device.matmul import EMULATED_RATIO, FAST_RATIO, ROUNDS, classify, exact_levels, measure, verdict
from mixprec.device.trust import ceiling, holds, settled

__all__ = ["DtypeSpeed", "Hardware", "probe", "resolve_device", "cache_dir", "available_memory", "DTYPES", "classify", "contradiction", "forget", "cache_path",
           "UNDECIDED", "UNSTABLE", "ceiling", "ratio_text", "stated", "recorded", "PROBE_FILE_VAR",
           "FAST_RATIO", "EMULATED_RATIO", "ROUNDS", "usable_flags"]

#: The precisions the probe measures, by short name.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: The class of a precision whose timing rounds disagreed (a busy machine): used as if
#: it were not fast, said as such, and never cached.
UNDECIDED = "undecided"
#: The class of a precision whose figure is not to be trusted: its rounds scattered more
#: than :data:`mixprec.device.trust.TIGHT` apart even after re-measuring, or it claims
#: more speed than the device's hardware allows (:func:`ceiling`). No evidence either way:
#: used as if not fast, said with its reason (``DtypeSpeed.note``), never cached.
UNSTABLE = "unstable"

_PROBE_VERSION = 6  # 6: which matmul levels change nothing; 5: a CPU timed on one thread in CPU time; 4: figures checked for spread and physical bounds



#: Undecided probes of this process, by cache path (never written to disk).
_UNDECIDED_THIS_PROCESS: dict[str, Hardware] = {}


def ratio_text(ratio: float | None, klass: str) -> str | None:
    """A probe figure as every table shows it: ``3.90x fp32``; where its class is
    ``undecided`` or ``unstable`` the figure is no evidence and reads so:
    ``53.0x fp32 measured, not used`` (``DtypeSpeed.note`` says why)."""
    if ratio is None:
        return None
    return f"{ratio:#.3g}x fp32" + (" measured, not used" if klass in (UNDECIDED, UNSTABLE) else "")


@dataclass(frozen=True)
class DtypeSpeed:
    """How one precision performs on the device.

    Attributes:
        name: ``fp32``, ``tf32``, ``bf16`` or ``fp16``.
        supported: the device can compute in it at all (for ``tf32``: it changes anything).
        gflops: measured matmul throughput, GFLOP/s.
        ratio: throughput relative to fp32.
        klass: ``fast``, ``no_speedup``, ``emulated`` or ``unsupported``; ``undecided``
            or ``unstable`` where the measurement gives no evidence (never cached).
        note: why the class is ``undecided`` or ``unstable``.
    """

    name: str
    supported: bool
    gflops: float | None
    ratio: float | None
    klass: str
    note: str | None = None

    @property
    def fast(self) -> bool:
        return self.klass == "fast"

    @property
    def emulated(self) -> bool:
        return self.klass == "emulated"


@dataclass(frozen=True)
class Hardware:
    """A measured description of one device.

    Attributes:
        device_type: ``cuda``, ``cpu`` or ``mps``.
        name: device or CPU model name.
        capability: CUDA compute capability, e.g. ``(8, 0)``; ``None`` elsewhere.
        memory_bytes: device memory (CUDA) or system memory (CPU).
        cpu_flags: the precision-relevant CPU flags (``avx512_bf16``, ``amx_bf16``, ``avx512_fp16``...).
        threads: the process's intra-op threads (part of the cache key; a CPU is timed on one
            thread in CPU time, so ``gflops`` there are one thread's rates: see ``clock``).
        torch_version: the torch that was measured.
        dtypes: per precision, its measured speed class.
        matmul_levels: fp32 matmul GFLOP/s under each ``float32_matmul_precision`` level.
        matmul_size: the square matmul size used.
        seconds: how long the measurement took.
        cached: whether this result came from the cache.
    """

    device_type: str
    name: str
    capability: tuple[int, int] | None
    memory_bytes: int | None
    cpu_flags: tuple[str, ...]
    threads: int
    torch_version: str
    dtypes: dict[str, DtypeSpeed]
    matmul_levels: dict[str, float] = field(default_factory=dict)
    matmul_size: int = 0
    seconds: float = 0.0
    cached: bool = False
    #: Per fast 16-bit dtype, per layer kind: how much faster the layer is kept in fp32
    #: (casts included) and whether it is clearly so (:func:`mixprec.device.layers.island_gains`).
    layers: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: What timed the figures: ``cpu-time, 1 thread`` on a CPU, ``cuda-events`` on a GPU.
    clock: str = ""
    #: Per float32 matmul level (``high``, ``medium``): whether an fp32 matmul at that level
    #: computed the same bits as at ``highest`` here, i.e. the level changes nothing on this
    #: device (empty: not measured).
    matmul_exact: dict[str, bool] = field(default_factory=dict)
    #: The file this description was read from (``MIXPREC_PROBE_FILE``); empty where it was measured here.
    recorded: str = ""

    def is_fast(self, dtype: str) -> bool:
        """Whether ``dtype`` (``bf16``, ``fp16``, ``tf32``) is fast here (:meth:`effective`)."""
        return self.effective(dtype).fast

    def effective(self, dtype: str) -> DtypeSpeed:
        """What decisions use for ``dtype``: the measured class, or where the probe could not
        decide (``undecided``, ``unstable``), the class the hardware states (:func:`stated`),
        its ``note`` saying so ("from the CPU flags (amx_bf16), not measured"). A precision
        neither decides stays as measured (used as not fast)."""
        speed = self.dtypes[dtype]
        if speed.klass not in (UNDECIDED, UNSTABLE):
            return speed
        said = stated(dtype, self.device_type, self.cpu_flags, self.capability)
        if said is None:
            return speed
        why = f"{said[1]}: the probe could not decide ({speed.note or speed.klass})"
        return dataclasses.replace(speed, klass=said[0], note=why)

    def fast_16bit(self) -> list[str]:
        """The 16-bit storage types that are fast here (:meth:`effective`), fastest first:
        measured ones by their rate, then those only the hardware states fast, bf16 first."""
        fast = [d for d in ("bf16", "fp16") if self.effective(d).fast]
        return sorted(fast, key=lambda d: (self.dtypes[d].klass in (UNDECIDED, UNSTABLE), -(self.dtypes[d].gflops or 0.0)
                                           if self.dtypes[d].klass not in (UNDECIDED, UNSTABLE) else 0.0))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["capability"] = list(self.capability) if self.capability else None
        data["cpu_flags"] = list(self.cpu_flags)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hardware:
        data = dict(data)
        data["dtypes"] = {k: DtypeSpeed(**v) for k, v in data["dtypes"].items()}
        data["capability"] = tuple(data["capability"]) if data.get("capability") else None
        data["cpu_flags"] = tuple(data.get("cpu_flags", ()))
        return cls(**data)


_INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile", "fma", "f16c")


#: ATen's CPU capability levels below AVX512 (``torch.backends.cpu.get_cpu_capability()``, capped
#: by ``ATEN_CPU_CAPABILITY``), with the vector flags its own kernels then leave unused.
_ATEN_BELOW_AVX512 = {"DEFAULT": ("avx2", "fma", "f16c", "avx512f"), "AVX2": ("avx512f",)}
#: oneDNN's instruction-set levels (``ONEDNN_MAX_CPU_ISA``, formerly ``DNNL_MAX_CPU_ISA``), lowest
#: first, with the flags each adds: 16-bit matrix products run in oneDNN, so a cap there leaves
#: them the flags up to its level (measured: bf16 products 85x slower under ``AVX2`` on an
#: AVX512-BF16 CPU, unchanged under ``ATEN_CPU_CAPABILITY=avx2``).
_ONEDNN_LEVELS = (("SSE41", ()), ("AVX", ()), ("AVX2", ("avx2", "fma", "f16c")), ("AVX2_VNNI", ()), ("AVX2_VNNI_2", ()),
                  ("AVX512_CORE", ("avx512f",)), ("AVX512_CORE_VNNI", ()), ("AVX512_CORE_BF16", ("avx512_bf16",)),
                  ("AVX10_1_512", ("avx512_fp16",)), ("AVX512_CORE_FP16", ("avx512_fp16",)),
                  ("AVX10_1_512_AMX", ("amx_bf16", "amx_tile")), ("AVX512_CORE_AMX", ("amx_bf16", "amx_tile")),
                  ("AVX10_1_512_AMX_FP16", ("amx_fp16",)), ("AVX512_CORE_AMX_FP16", ("amx_fp16",)))


def usable_flags(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The CPU ``flags`` this process's kernels may use.

    A process started with ``ONEDNN_MAX_CPU_ISA=AVX2`` computes an AVX512-BF16 or AMX CPU's
    bf16 and fp16 products as a CPU with AVX2 only does (emulated), so the flags beyond that
    level are not the process's to state; ``ATEN_CPU_CAPABILITY`` caps ATen's own vector
    kernels (``avx512f``) the same way. Each cap is read where its library reads it.
    """
    dropped: set[str] = set(_ATEN_BELOW_AVX512.get(torch.backends.cpu.get_cpu_capability().upper(), ()))
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    names = [name for name, _ in _ONEDNN_LEVELS]
    if cap in names:
        level = names.index(cap) + 1
        beyond = {flag for _, added in _ONEDNN_LEVELS[level:] for flag in added}
        dropped |= beyond - {flag for _, added in _ONEDNN_LEVELS[:level] for flag in added} - {"avx2", "fma", "f16c"}
    return tuple(flag for flag in flags if flag not in dropped)


def _cpu_info() -> tuple[str, tuple[str, ...]]:
    """The CPU's name and the precision-relevant flags this process may use (:func:`usable_flags`)."""
    name, flags = platform.processor() or platform.machine(), ()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return name, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and name in ("", platform.machine(), platform.processor()):
            name = value.strip()
        elif key in ("flags", "Features") and not flags:
            present = set(value.split())
            flags = tuple(f for f in _INTERESTING_FLAGS if f in present)
    return name, usable_flags(flags)


def _system_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(device: str | torch.device | None = None) -> int | None:
    """Bytes that can be allocated now: free CUDA memory, or the system's ``MemAvailable``.

    ``None`` where the platform does not say.
    """
    dev = resolve_device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cache_dir() -> Path:
    """Where probe results are cached: ``MIXPREC_CACHE_DIR`` or the user cache dir."""
    override = os.environ.get("MIXPREC_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("mixprec"))


#: The device types :func:`resolve_device` accepts (``cuda`` also as ``cuda:N``).
DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "mps")


def resolve_device(device: str | torch.device | None, *, source: str = "device") -> torch.device:
    """The device ``device`` names, checked against this machine; ``None``: CUDA when available, else the CPU.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a :class:`torch.device`.
        source: where the value came from, for the message (``"--device"`` on the command line).

    Raises:
        ValueError: naming ``source``, the value and why this machine cannot use it (an
            unknown device type, CUDA or MPS not available, a CUDA index past the last GPU).
    """
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    shown = quote(str(device))
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{source} {shown}: unsupported device; choose cpu, cuda, cuda:N or mps") from None
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"{source} {shown}: unsupported device; choose cpu, cuda, cuda:N or mps")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{source} {shown}: CUDA is not available on this machine (torch.cuda.is_available() "
                         "is false); use cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ValueError(f"{source} {shown}: this machine has {count} CUDA device{'s' if count != 1 else ''} "
                         f"(cuda:0 to cuda:{count - 1})")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"{source} {shown}: MPS is not available on this machine; use cpu")
    return dev


def _cache_key(dev: torch.device, name: str, flags: tuple[str, ...], threads: int) -> str:
    raw = json.dumps([_PROBE_VERSION, dev.type, name, flags, threads, torch.__version__, platform.machine()])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _load_cached(path: Path) -> Hardware | None:
    """The cached probe at ``path``; None where there is none, it does not parse, or it holds a
    figure no measurement may keep (an unsettled class, a ratio above :func:`ceiling`): measured again."""
    try:
        data = json.loads(path.read_text())
        hw = dataclasses.replace(Hardware.from_dict(data), cached=True)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return hw if holds(hw, (UNDECIDED, UNSTABLE)) else None


#: The environment variable naming a recorded machine description used instead of measuring.
PROBE_FILE_VAR = "MIXPREC_PROBE_FILE"


def recorded(device_type: str) -> Hardware | None:
    """The description of ``device_type`` in the file :data:`PROBE_FILE_VAR` names; None where it is unset.

    The file holds what ``mixprec env --json`` prints (its ``hardware``), one
    :meth:`Hardware.to_dict` object, or a list of them (one per device type).

    Raises:
        ValueError: the file cannot be read, is not such a description, or describes no
            ``device_type`` device; the message names the variable, the file and what is valid.
    """
    path = os.environ.get(PROBE_FILE_VAR, "").strip()
    if not path:
        return None
    where = f"{PROBE_FILE_VAR}={quote(path, limit=1000)}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it ({exc.strerror or exc}); unset it to measure this machine") from None
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON ({exc}); record one with `mixprec env --json > FILE`") from None
    if isinstance(data, dict) and "hardware" in data:
        data = data["hardware"]
    items = data if isinstance(data, list) else [data]
    found = []
    for index, item in enumerate(items):
        try:
            hw = Hardware.from_dict(item)
            if hw.device_type not in DEVICE_TYPES or "fp32" not in hw.dtypes:
                raise ValueError(f"device_type {quote(hw.device_type)}" if hw.device_type not in DEVICE_TYPES else "no fp32 entry")
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            at = f" (item {index})" if isinstance(data, list) else ""
            raise ValueError(f"{where}{at}: not a machine description ({type(exc).__name__}: {exc}); "
                             "record one with `mixprec env --json > FILE`") from None
        found.append(hw)
    for hw in found:
        if hw.device_type == device_type:
            return dataclasses.replace(hw, recorded=path, cached=True)
    described = ", ".join(sorted({hw.device_type for hw in found})) or "nothing"
    raise ValueError(f"{where} describes {described}, not {device_type}: record it with "
                     f"`mixprec env --device {device_type} --json`, or unset {PROBE_FILE_VAR} to measure this machine")


def _recorded_for(device: str | torch.device | None) -> Hardware | None:
    """The recorded description for ``device`` (a device this machine need not have: a recording
    moves decisions, not kernels); None where ``MIXPREC_PROBE_FILE`` is unset."""
    if not os.environ.get(PROBE_FILE_VAR, "").strip():
        return None
    if device is None:
        return recorded(resolve_device(None).type)
    try:
        kind = torch.device(device.strip().lower() if isinstance(device, str) else device).type
    except (RuntimeError, TypeError, ValueError):
        kind = None
    if kind not in DEVICE_TYPES:
        resolve_device(device)  # refuses it in its own words
    return recorded(kind)


def probe(device: str | torch.device | None = None, *, use_cache: bool = True, budget_s: float = 0.05,
          layers: bool = True) -> Hardware:
    """Describe and measure a device.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``; default CUDA when
            available, else CPU.
        use_cache: reuse an earlier measurement of this machine, device and torch
            version, and store a new one.
        budget_s: time spent timing each precision (the whole probe stays well
            under a second on a CPU; an emulated type stops after one call).
        layers: also time, for each fast 16-bit type, the layer kinds that may be
            faster kept in fp32 (:mod:`mixprec.device.layers`; about 2 s on a CPU).

    Returns:
        A :class:`Hardware`: where ``MIXPREC_PROBE_FILE`` is set, the description it records
        for this device type, not measured (:func:`recorded`).

    Examples:
        >>> hw = mixprec.device.hardware.probe()
        >>> hw.dtypes["bf16"].klass
        'fast'
    """
    described = _recorded_for(device)
    if described is not None:
        return described
    dev = resolve_device(device)
    cpu_name, flags = _cpu_info()
    threads = torch.get_num_threads()
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        name, capability, memory = props.name, (props.major, props.minor), int(props.total_memory)
    else:
        name, capability, memory = (cpu_name if dev.type == "cpu" else "Apple MPS"), None, _system_memory()

    path = cache_dir() / f"probe-{_cache_key(dev, name, flags, threads)}.json"
    if use_cache:
        cached = _load_cached(path) or _UNDECIDED_THIS_PROCESS.get(str(path))
        if cached is not None:
            return cached

    n = 2048 if dev.type == "cuda" else 512
    start = time.perf_counter()
    with one_thread(dev):
        rates, levels = measure(dev, n, budget_s)
        exact = exact_levels(dev, n)
    seconds = time.perf_counter() - start

    fp32 = rates["fp32"]["rate"] or None
    dtypes = {}
    undecided = False
    for dname, measured in rates.items():
        rate, per_round = measured["rate"], measured["ratios"]
        # The ratio of the best calls, and the class only where every round gave it.
        ratio = (rate / fp32) if (rate and fp32) else None
        supported = rate is not None
        if dname == "tf32":
            # TF32 only exists where it changes something: Ampere+ GPUs, or CPUs whose
            # oneDNN path makes "high" measurably faster.
            supported = (capability is not None and capability >= (8, 0)) or (dev.type == "cpu" and ratio is not None and ratio >= FAST_RATIO)
        if dname == "bf16" and dev.type == "cuda":
            supported = supported and torch.cuda.is_bf16_supported()
        klass = "fast" if dname == "fp32" else classify(ratio, supported)
        note = None
        doubt = settled(ratio, per_round, ceiling(dname, dev.type, flags, capability)) \
            if dname != "fp32" and supported else None
        if dname != "fp32" and supported and per_round and verdict(per_round) is None:
            klass, undecided, note = UNDECIDED, True, "its timing rounds disagreed on the class"
        elif doubt is not None:
            klass, undecided, note = UNSTABLE, True, doubt
        dtypes[dname] = DtypeSpeed(dname, supported, round(rate, 2) if rate else None, round(ratio, 3) if ratio else None,
                                   klass, note)

    hw = Hardware(device_type=dev.type, name=name, capability=capability, memory_bytes=memory, cpu_flags=flags,
                  threads=threads, torch_version=torch.__version__, dtypes=dtypes,
                  matmul_levels={k: round(v, 2) for k, v in levels.items()}, matmul_exact=exact, matmul_size=n,
                  seconds=round(seconds, 3),
                  clock=clock_for(dev).name + (", 1 thread" if dev.type == "cpu" else ""))
    if layers:
        from mixprec.device.layers import island_gains

        with one_thread(dev):
            fast = {d: island_gains(DTYPES[d], dev) for d in ("bf16", "fp16") if dtypes[d].klass == "fast"}
        hw = dataclasses.replace(hw, layers=fast, seconds=round(time.perf_counter() - start, 3))
        # A layer figure whose rounds scattered is kept in this process (as no island), never on disk.
        undecided = undecided or any(info.get("unstable") for kinds in fast.values() for info in kinds.values())
    # A verdict the rounds disagreed on is not kept on disk: the next process measures
    # again. This process keeps it, so its decisions (presets, the guard's fallback
    # ladder) do not change from one call to the next.
    if use_cache and undecided:
        _UNDECIDED_THIS_PROCESS[str(path)] = dataclasses.replace(hw, cached=True)
    if use_cache and not undecided:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps(hw.to_dict(), indent=2))  # processes probing at once leave one whole file
        except (OSError, UnicodeError):
            # The cache is an optimisation; an unwritable cache dir only costs a re-measure.
            pass
    return hw


def cache_path(hw: Hardware) -> Path:
    """Where the probe of ``hw``'s machine, device, threads and torch version is cached."""
    return cache_dir() / f"probe-{_cache_key(torch.device(hw.device_type), hw.name, hw.cpu_flags, hw.threads)}.json"


def contradiction(hw: Hardware, dtype: str, low: float, high: float) -> str | None:
    """Why a later measurement contradicts the probe's class of ``dtype``, or None.

    ``low``..``high`` is the interval of a whole model's speed in ``dtype`` relative to
    fp32, measured in paired rounds. A model is not a matmul, so only unmistakable
    disagreement counts: a precision classed as not fast whose model ran at least
    :data:`FAST_RATIO` times fp32, or one classed fast whose model ran below
    :data:`EMULATED_RATIO` times fp32.
    """
    speed = hw.dtypes.get(dtype)
    if speed is None or not speed.supported:
        return None
    if speed.klass != "fast" and low >= FAST_RATIO:
        return (f"the probe classed {dtype} {speed.klass} ({speed.ratio}x fp32) but a model in {dtype} ran "
                f"{low:.2f}x to {high:.2f}x fp32 here")
    if speed.klass == "fast" and high < EMULATED_RATIO:
        return (f"the probe classed {dtype} fast ({speed.ratio}x fp32) but a model in {dtype} ran "
                f"{low:.2f}x to {high:.2f}x fp32 here")
    return None


def forget(hw: Hardware) -> bool:
    """Drop the cached probe of ``hw``'s machine, so the next :func:`probe` measures again."""
    try:
        cache_path(hw).unlink()
        return True
    except OSError:
        return False
