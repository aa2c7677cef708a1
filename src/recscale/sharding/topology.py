"""Cluster description for the planner, with named presets.

All capacities and bandwidths are **per rank** (one rank = one GPU, or one CPU process on
``cpu-local``); node-level figures are divided by ``local_world_size``. Bandwidths are bytes per
second in one direction. A tier with capacity 0 does not exist on the topology (``cpu-local`` has no
HBM, so its compute tier is DDR).

Preset values and their sources (see also docs/sharding.md):

``zionex`` - Meta's ZionEX node, Mudigere et al., "Software-Hardware Co-design for Fast and Scalable
Training of Deep Learning Recommendation Models", ISCA 2022 (arXiv:2104.05158): 8 x A100 40 GB per
node, NVLink/NVSwitch inside the node, a dedicated 200 Gb/s RDMA NIC per GPU for scale-out,
1.5 TB host DDR and 1.5 TB SSD per node (the project brief's figures for the node).
  - hbm_bytes 40e9, hbm_bw 1.555e12 B/s: NVIDIA A100 datasheet (A100 40GB SXM, HBM2 1,555 GB/s).
  - intra_node_bw 300e9 B/s: NVLink 3 on A100 is 600 GB/s bidirectional per GPU, 300 GB/s each way.
  - inter_node_bw 25e9 B/s: 200 Gb/s per GPU NIC.
  - ddr_bytes 1.5e12/8, ddr_bw 25e9 B/s: the GPU reads host memory over PCIe Gen4 x16
    (32 GB/s per direction theoretical; ~25 GB/s achievable is our assumption).
  - ssd_bytes 1.5e12/8, ssd_bw 2e9 B/s: assumption for random row reads from one NVMe drive share.

``dgx-h100`` - NVIDIA DGX H100 (NVIDIA DGX BasePOD reference architecture, "Core Components":
8 x H100, 640 GB GPU memory, 2 TB DDR5, 8 x ConnectX-7 up to 400 Gb/s, 8 x 3.84 TB U.2 NVMe).
  - hbm_bytes 80e9, hbm_bw 3.35e12 B/s: H100 SXM5 80 GB HBM3 datasheet.
  - intra_node_bw 450e9 B/s: NVLink 4, 900 GB/s bidirectional per GPU.
  - inter_node_bw 50e9 B/s: 400 Gb/s ConnectX-7 per GPU.
  - ddr_bytes 2e12/8, ddr_bw 50e9 B/s: PCIe Gen5 x16 (64 GB/s per direction theoretical; ~50 assumed).
  - ssd_bytes 3.84e12 (one U.2 drive per GPU), ssd_bw 3e9 B/s: assumption for random row reads.

``cpu-local`` - this kind of development machine: 2 cores, 24 GB RAM, no HBM, no SSD tier; two
ranks (gloo processes) by default.
  - ddr_bytes 24e9/local_world_size; ddr_bw 2.7e9 B/s: measured here, numpy gather of random 256-B
    rows, one core (``E[idx]`` with E 2M x 64 fp32, 500k ids).
  - intra_node_bw 1.8e9 B/s: measured here, gloo ``all_to_all_single`` of 64 MiB between 2 local
    processes (torch 2.13).
  - inter_node_bw 1.25e9 B/s: assumption (10 GbE), only used if world_size > local_world_size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from recscale.config import ConfigError, check, check_choice, nearest

from .types import TIERS


def _positive_int(key: str, value: Any) -> None:
    check(not isinstance(value, bool) and isinstance(value, Integral) and value > 0, key, value,
          "a positive integer")


@dataclass(frozen=True)
class Topology:
    """World size, ranks per host, memory per tier and bandwidths, all per rank."""

    world_size: int
    local_world_size: int
    hbm_bytes: float
    ddr_bytes: float
    ssd_bytes: float
    hbm_bw: float
    ddr_bw: float
    ssd_bw: float
    intra_node_bw: float
    inter_node_bw: float
    name: str = "custom"
    device: str = "cuda"
    # Measured by calibration (``recscale calibrate``; 0 = not measured, as in the presets). The
    # per-item ones (``*_id_s``, ``*_row_s``, ``bag_s``) enter the planner's per-shard costs
    # beside the bandwidths above; the fixed ones the step-time prediction
    # (``recscale.sharding.step_time``):
    hbm_op_s: float = 0.0  # seconds per step of a rank's lookup + fused update on the tier
    ddr_op_s: float = 0.0
    ssd_op_s: float = 0.0
    hbm_id_s: float = 0.0  # seconds per id looked up (and updated) on the tier
    ddr_id_s: float = 0.0
    ssd_id_s: float = 0.0
    # seconds per distinct row the fused backward updates on the tier (sorting the ids, finding
    # the unique rows, each row's update): a batch of repeated ids costs far less than as many
    # distinct ones, beyond what their bytes say
    hbm_row_s: float = 0.0
    ddr_row_s: float = 0.0
    ssd_row_s: float = 0.0
    bag_s: float = 0.0  # seconds per pooled vector (forward + its gradient), compute tier
    intra_node_lat_s: float = 0.0  # seconds per collective call inside a host
    inter_node_lat_s: float = 0.0  # ... across hosts
    dense_flops: float = 0.0  # FLOP/s of the dense MLPs' forward + backward
    dense_op_s: float = 0.0  # seconds per step of the dense arch's fixed work (loss, optimizer)
    # seconds per element of the interaction, forward + backward (step_time.DenseSpec); 0: its
    # FLOPs at dense_flops
    interaction_s: float = 0.0
    # seconds per element of the [batch, tables x dim] pooled output that the sharded (or
    # multi-tier) collection assembles from its pieces, forward + backward
    assemble_s: float = 0.0
    # the sharded exchange's work on the rank's own cores (bucketing, packing, codecs, summing;
    # on a CPU also gloo's copies): seconds per step, and the bytes a rank sends per second
    exchange_op_s: float = 0.0
    exchange_bw: float = 0.0
    codec_s: float = 0.0  # seconds per element a reduced-precision codec encodes or decodes
    # bytes a rank sends to other hosts per second of its own CPU, beyond exchange_bw (the
    # host's network stack); 0: nothing beyond
    inter_node_cpu_bw: float = 0.0
    # seconds per step of the rank's own CPU for exchanging across hosts, beyond one host's and
    # whatever the bytes: the network stack's work per call (syscalls, small packets)
    inter_node_cpu_s: float = 0.0
    # bytes a rank may send across hosts per collective call above inter_node_bw before that
    # rate holds (a token bucket's burst, as NIC and cloud rate limiters have: refilled while
    # the step computes between calls); 0: every byte at inter_node_bw
    inter_node_burst_bytes: float = 0.0

    def __post_init__(self) -> None:
        for key in ("world_size", "local_world_size"):
            v = getattr(self, key)
            _positive_int(key, v)
            object.__setattr__(self, key, int(v))
        check(self.world_size % self.local_world_size == 0, "world_size", self.world_size,
              f"a multiple of local_world_size={self.local_world_size} "
              f"(e.g. {self.local_world_size * max(1, self.world_size // self.local_world_size)})")
        for key in ("hbm_bytes", "ddr_bytes", "ssd_bytes", "hbm_bw", "ddr_bw", "ssd_bw",
                    *CALIBRATED,
                    "intra_node_bw", "inter_node_bw"):
            v = getattr(self, key)
            check(not isinstance(v, bool) and isinstance(v, Real) and v >= 0 and v != float("inf"),
                  key, v, "a non-negative finite number")
            object.__setattr__(self, key, float(v))
        for t in TIERS:
            check(self.capacity(t) <= 0 or self.bandwidth(t) > 0, f"{t}_bw", self.bandwidth(t),
                  f"a positive number when {t}_bytes > 0")
        check(len(self.tiers) > 0, "hbm_bytes/ddr_bytes/ssd_bytes", 0,
              "at least one tier with positive capacity")
        check(not (self.world_size > 1 and self.local_world_size > 1 and self.intra_node_bw <= 0),
              "intra_node_bw", self.intra_node_bw, "a positive number")
        check(not (self.world_size > self.local_world_size and self.inter_node_bw <= 0),
              "inter_node_bw", self.inter_node_bw, "a positive number")
        check(self.device in ("cuda", "cpu"), "device", self.device, "'cuda' or 'cpu'")

    # --- derived ---------------------------------------------------------------------------------
    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    def host_of(self, rank: int) -> int:
        return rank // self.local_world_size

    def capacity(self, tier: str) -> float:
        return float(getattr(self, f"{tier}_bytes"))

    def bandwidth(self, tier: str) -> float:
        return float(getattr(self, f"{tier}_bw"))

    @property
    def tiers(self) -> tuple[str, ...]:
        """Tiers that exist (capacity > 0), fastest first; the first is the compute tier."""
        return tuple(t for t in TIERS if self.capacity(t) > 0)

    @property
    def compute_tier(self) -> str:
        return self.tiers[0]

    def with_ram_budget(self, ram_bytes: float, ssd_bytes: float,
                        ssd_bw: float | None = None) -> Topology:
        """This topology with ``ram_bytes`` of host memory (DDR) per rank for embeddings and an
        SSD tier of ``ssd_bytes`` per rank (bandwidth ``ssd_bw``, default the topology's or
        ``DEFAULT_SSD_BW``): the planner then spills what does not fit in RAM to SSD."""
        from dataclasses import replace

        for key, v in (("ram_budget_bytes", ram_bytes), ("ssd_bytes", ssd_bytes)):
            check(not isinstance(v, bool) and isinstance(v, Real) and v > 0, key, v,
                  "a positive number of bytes")
        bw = ssd_bw or self.ssd_bw or DEFAULT_SSD_BW
        return replace(self, ddr_bytes=float(ram_bytes), ssd_bytes=float(ssd_bytes),
                       ssd_bw=float(bw))

    # --- presets ----------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, world_size: int | None = None,
               local_world_size: int | None = None) -> Topology:
        """A named topology (``cpu-local``, ``zionex``, ``dgx-h100``).

        ``world_size`` defaults to one host; per-node memory is shared by ``local_world_size`` ranks.
        If ``world_size`` is smaller than a host, the host shrinks to ``world_size`` ranks.
        """
        check_choice("topology", name, tuple(PRESETS))
        node = PRESETS[name]
        lws = node["local_world_size"] if local_world_size is None else local_world_size
        _positive_int("local_world_size", lws)
        ws = lws if world_size is None else world_size
        _positive_int("world_size", ws)
        lws = min(int(lws), int(ws))
        return cls(
            world_size=int(ws),
            local_world_size=lws,
            hbm_bytes=node["hbm_per_gpu"],
            ddr_bytes=node["ddr_per_node"] / lws,
            ssd_bytes=node["ssd_per_node"] / lws,
            hbm_bw=node["hbm_bw"],
            ddr_bw=node["ddr_bw"],
            ssd_bw=node["ssd_bw"],
            intra_node_bw=node["intra_node_bw"],
            inter_node_bw=node["inter_node_bw"],
            name=name,
            device=node["device"],
        )

    def op_seconds(self, tier: str) -> float:
        return float(getattr(self, f"{tier}_op_s"))

    def id_seconds(self, tier: str) -> float:
        return float(getattr(self, f"{tier}_id_s"))

    def row_seconds(self, tier: str) -> float:
        return float(getattr(self, f"{tier}_row_s"))

    @property
    def calibrated(self) -> bool:
        """Whether calibration measured this topology (any measured-only field set)."""
        return any(getattr(self, k) for k in CALIBRATED)

    def to_dict(self) -> dict[str, Any]:
        """Every field; the measured-only ones (``CALIBRATED``) only when set, so a preset's
        dict (and a plan's) is what it was before they existed."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in CALIBRATED or getattr(self, f.name)}

    def for_world(self, world_size: int, local_world_size: int | None = None) -> Topology:
        """This machine's measured figures for ``world_size`` ranks, ``local_world_size`` per
        host (default: this topology's, capped at ``world_size``); host memory is shared by the
        host's ranks, so per-rank DDR and SSD scale with the ranks per host."""
        from dataclasses import replace

        _positive_int("world_size", world_size)
        lws = self.local_world_size if local_world_size is None else local_world_size
        _positive_int("local_world_size", lws)
        lws = min(int(lws), int(world_size))
        share = self.local_world_size / lws
        return replace(self, world_size=int(world_size), local_world_size=lws,
                       ddr_bytes=self.ddr_bytes * share, ssd_bytes=self.ssd_bytes * share)

    def save(self, path: str | Path) -> Path:
        """Write this topology as YAML (the file ``sharding.topology`` accepts)."""
        import yaml

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"topology": self.to_dict()}, sort_keys=False))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Topology:
        """A topology file written by ``save`` (``recscale calibrate``): YAML or JSON, the
        fields under a top-level ``topology`` key."""
        import yaml

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"topology file {str(path)!r} does not exist: expected a file "
                              "written by `recscale calibrate` or a preset name "
                              f"({', '.join(PRESETS)})")
        d = yaml.safe_load(path.read_text())
        if not isinstance(d, Mapping) or not isinstance(d.get("topology"), Mapping):
            raise ConfigError(f"topology file {str(path)!r} is not allowed: expected a mapping "
                              "with the topology's fields under the key 'topology'")
        return cls.from_dict(d["topology"])

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Topology:
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - allowed)
        if unknown:
            raise ConfigError(f"unknown key topology.{unknown[0]}{nearest(unknown[0], allowed)}; "
                              "allowed keys: "
                              + ", ".join(sorted(allowed)))
        d = dict(d)
        # a topology saved without its host size is one host (what its collectives assumed)
        d.setdefault("local_world_size", d.get("world_size"))
        return cls(**d)


# Fields only calibration sets (see the class); 0 = not measured.
CALIBRATED = ("hbm_op_s", "ddr_op_s", "ssd_op_s", "hbm_id_s", "ddr_id_s", "ssd_id_s",
              "hbm_row_s", "ddr_row_s", "ssd_row_s", "bag_s",
              "intra_node_lat_s", "inter_node_lat_s", "dense_flops", "dense_op_s",
              "interaction_s", "assemble_s", "exchange_op_s", "exchange_bw", "codec_s",
              "inter_node_cpu_bw", "inter_node_cpu_s", "inter_node_burst_bytes")

# SSD random-row read bandwidth assumed where a topology has no SSD tier of its own (a memory-mapped
# file on a local NVMe drive; an assumption like the presets' SSD figures, not a measurement).
DEFAULT_SSD_BW = 1e9

# Node-level figures; see the module docstring for sources.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-local": {
        "local_world_size": 2, "device": "cpu",
        "hbm_per_gpu": 0.0, "ddr_per_node": 24e9, "ssd_per_node": 0.0,
        "hbm_bw": 0.0, "ddr_bw": 2.7e9, "ssd_bw": 0.0,
        "intra_node_bw": 1.8e9, "inter_node_bw": 1.25e9,
    },
    "zionex": {
        "local_world_size": 8, "device": "cuda",
        "hbm_per_gpu": 40e9, "ddr_per_node": 1.5e12, "ssd_per_node": 1.5e12,
        "hbm_bw": 1.555e12, "ddr_bw": 25e9, "ssd_bw": 2e9,
        "intra_node_bw": 300e9, "inter_node_bw": 25e9,
    },
    "dgx-h100": {
        "local_world_size": 8, "device": "cuda",
        "hbm_per_gpu": 80e9, "ddr_per_node": 2e12, "ssd_per_node": 8 * 3.84e12,
        "hbm_bw": 3.35e12, "ddr_bw": 50e9, "ssd_bw": 3e9,
        "intra_node_bw": 450e9, "inter_node_bw": 50e9,
    },
}
