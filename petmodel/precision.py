"""Which device this process trains on, and whether it can train in bf16 (decided once, by trying it).

bf16 autocast of an LSTM goes through oneDNN on a CPU, which has bf16 LSTM kernels only where the
CPU has AVX-512 BF16 or AMX; elsewhere (AVX2-only CPUs) the first forward step fails deep inside
oneDNN ("could not create a primitive descriptor for the LSTM forward propagation primitive"). CPU
flags are an unreliable guide (virtual machines hide some, oneDNN has its own dispatch), so we run
one tiny bf16 LSTM step, forward and backward, and cache the answer for the process. A run asks
before it is recorded; on a cluster the workers that would train answer for themselves.
"""

from __future__ import annotations

import functools

from petmodel.errors import UnsupportedPrecision


@functools.lru_cache(maxsize=8)
def bf16_supported(device: str = "cpu") -> bool:
    """Whether a bf16-autocast LSTM step (forward and backward) runs on ``device`` here."""
    import torch

    try:
        dev = torch.device(device)
        lstm = torch.nn.LSTM(8, 8, batch_first=True).to(dev)
        x = torch.randn(2, 3, 8, device=dev, requires_grad=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out, _ = lstm(x)
        out.float().sum().backward()
        return True
    except RuntimeError:  # oneDNN (or CUDA) has no bf16 LSTM kernel for this device
        return False


def device_name(device: str = "cpu") -> str:
    """``device`` for the refusal sentence: the GPU's name, or the CPU and its instruction set."""
    import torch

    if torch.device(device).type == "cuda":
        return f"GPU ({torch.cuda.get_device_name(torch.device(device))})"
    return f"CPU ({torch.backends.cpu.get_cpu_capability()}: no AVX-512 BF16 or AMX)"


def unsupported_sentence(owner: str, device: str) -> str:
    """The one sentence a refused bf16 run shows: ``owner``'s ``device`` ("this machine's", "CPU (AVX2…)")."""
    return f"bf16 precision does not run on {owner} {device}; choose fp32 precision."


def local_device() -> str:
    """Where a run in this process trains: the first GPU when CUDA sees one, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_precision(precision: str, device: str = "cpu") -> None:
    """Refuse bf16 in one sentence when this process's ``device`` cannot train in it."""
    if precision == "bf16" and not bf16_supported(device):
        raise UnsupportedPrecision(unsupported_sentence("this machine's", device_name(device)))


def worker_bf16_probe() -> dict[str, object]:
    """Runs on a Dask worker: whether the device it would train on runs bf16, and what that device is."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {"supported": bf16_supported(device), "device": device_name(device)}
