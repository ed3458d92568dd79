"""The quiet-machine check shared by the benchmark drivers (bench-cluster-ab.py,
bench-cluster-load.py): a run starts only when the rest of the machine is idle."""
import time


def busy(sec=2.0):
    """Share of the machine's CPU time that was busy over `sec` seconds (0 to 1), from /proc/stat."""
    def snap():
        with open("/proc/stat") as f:
            v = list(map(int, f.readline().split()[1:]))
        return sum(v), v[3] + v[4]

    t0, i0 = snap()
    time.sleep(sec)
    t1, i1 = snap()
    return 1 - (i1 - i0) / max(1, t1 - t0)
