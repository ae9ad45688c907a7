"""The device a benchmark runs on (``--device cpu|cuda``): its name, how many processes use
it, its measured peak rate, and the model FLOPs utilisation (MFU) of a rate of tokens.

The bench's own process may use CUDA: its workers are started with fork and exec (torchrun).
"""

from __future__ import annotations

import functools
import platform
import time
from pathlib import Path

CHOICES = ("cpu", "cuda")
CUDA_MATMUL = 8192  # the peak on CUDA: a bf16 8192 x 8192 x 8192 matmul, 3 warm-up, 10 timed
CPU_SECONDS = 1.0  # the peak on CPU: an fp32 matmul on one thread sized to take about this


def require(device: str) -> None:
    """Exit with one line when ``device`` cannot run here."""
    if device not in CHOICES:
        raise SystemExit(f"--device {device!r}: choose from {', '.join(CHOICES)}")
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit(f"--device cuda: no CUDA device is visible here (torch "
                             f"{torch.__version__}, CUDA {torch.version.cuda}); use --device cpu")


def processes(device: str) -> int:
    """Worker processes per benchmark side: 2 on CPU (the 2-core test host), one per GPU."""
    if device == "cpu":
        return 2
    import torch
    return torch.cuda.device_count()


@functools.cache
def name(device: str) -> str:
    """What the rows say they ran on: the GPU's name, or the CPU's model."""
    if device == "cuda":
        import torch
        return str(torch.cuda.get_device_name())
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"cpu: {model}"


@functools.cache
def peak_flops(device: str) -> float:
    """FLOP/s one worker process can reach on ``device``, measured once per bench process."""
    import torch
    if device == "cuda":
        n = CUDA_MATMUL
        a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for _ in range(3):
            torch.matmul(a, b)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(10):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize()
        rate = 10 * 2 * n ** 3 / (start.elapsed_time(end) / 1000)
        del a, b
        torch.cuda.empty_cache()
        return rate
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs (OMP_NUM_THREADS=1)
    try:
        rate = cpu_matmul_rate(512)
        n = max(512, round((rate * CPU_SECONDS / 2) ** (1 / 3) / 64) * 64)
        return max(cpu_matmul_rate(n) for _ in range(2))
    finally:
        torch.set_num_threads(threads)


def cpu_matmul_rate(n: int) -> float:
    """FLOP/s of one fp32 n x n x n matmul on CPU."""
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    began = time.perf_counter()
    torch.matmul(a, b)
    return 2 * n ** 3 / (time.perf_counter() - began)


def flops_per_token(params: int, layers: int, width: int, context: int) -> dict[str, float]:
    """A transformer's training FLOPs per token: 6N, and nanoGPT's ``estimate_mfu`` that adds
    attention's 12 x layers x width x context."""
    return {"6N": 6.0 * params, "with attention": 6.0 * params + 12.0 * layers * width * context}


def mfu(tokens_per_s: float, flops: float, device: str, workers: int) -> float:
    """Model FLOPs utilisation: the FLOP/s achieved over the peak of ``workers`` devices."""
    return tokens_per_s * flops / (peak_flops(device) * workers)
