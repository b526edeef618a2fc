"""Why and how often a finished torchrun worker aborted on its way out (attnlab/parallel/distributed.py).

1. Does ``destroy_process_group`` stop gloo's threads? Under torchrun (2 processes), each rank
   joins a gloo group, runs one all-reduce (and, in the second case, builds a DDP model, which it
   then deletes and garbage-collects), destroys the group and counts its own threads.
2. How often does a worker abort? Runs tests/ddp_worker.py (one DDP update of a tiny model on
   2 gloo processes) N times under torchrun while one busy-looping process loads the machine, and
   counts the runs that did not exit with status 0, with the first line each failure printed.
   The load widens the window in which a gloo thread frees a finished collective's tensor after
   the main thread has begun the interpreter's shutdown.

    .venv/bin/python docs/experiments/ddp_exit_stress.py 160

Before ``exit_worker``, 1 of 40 and 1 of 80 such runs aborted with "terminate called without an
active exception" (SIGABRT), also with ``destroy_process_group`` called.
"""

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).parent / "torchrun"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}"}


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


def count_threads_after_destroy(with_ddp: bool) -> None:
    """Run under torchrun: rank 0 prints its thread count before joining and after destroying."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    before = len(os.listdir("/proc/self/task"))
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(2))
    if with_ddp:
        model = DDP(torch.nn.Linear(3, 3))
        model(torch.ones(2, 3)).sum().backward()
        del model
        gc.collect()
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        print(
            f"{'with' if with_ddp else 'without'} DDP: {before} thread(s) before joining, "
            f"{len(os.listdir('/proc/self/task'))} after destroy_process_group"
        )


def stress(runs: int) -> None:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    failures = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(runs):
                done = torchrun(str(ROOT / "tests" / "ddp_worker.py"), str(Path(tmp) / "out.pt"), "1")
                if done.returncode != 0:
                    failures.append(f"run {i + 1}: {(done.stderr.strip().splitlines() or ['(no output)'])[0]}")
    finally:
        hog.kill()
    print(f"{len(failures)} of {runs} runs failed")
    print("\n".join(failures))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--threads"]:
        count_threads_after_destroy(sys.argv[2] == "ddp")
    else:
        for case in ("plain", "ddp"):
            print(torchrun(__file__, "--threads", case).stdout.strip())
        stress(int(sys.argv[1]) if len(sys.argv) > 1 else 160)
