"""Job traces: reading real traces into :class:`Trace`, writing canonical CSV, windows.

Every reader returns a :class:`Trace` whose jobs are sorted by submission and
which says how many source rows were skipped (and why) and how many durations
are right-censored, so that downstream reports can be honest about the data.
"""

from rlsched.workload.canonical import read_canonical, write_canonical
from rlsched.workload.dlrm import read_dlrm_services
from rlsched.workload.formats import FORMATS, detect_format, load_trace
from rlsched.workload.openb import read_openb_nodes, read_openb_pods
from rlsched.workload.philly import philly_virtual_clusters, read_philly
from rlsched.workload.trace import Trace
from rlsched.workload.windows import offered_load, scale_to_load, split_windows, take, window

__all__ = [
    "FORMATS",
    "Trace",
    "detect_format",
    "load_trace",
    "offered_load",
    "philly_virtual_clusters",
    "read_canonical",
    "read_dlrm_services",
    "read_openb_nodes",
    "read_openb_pods",
    "read_philly",
    "scale_to_load",
    "split_windows",
    "take",
    "window",
    "write_canonical",
]
