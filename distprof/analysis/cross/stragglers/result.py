"""What the stragglers analysis hands on (:func:`.find.find_stragglers`): a row per rank, a row per host, the
per-step straggler, and the rule with its floor — the report's ``stragglers`` and ``straggler_info`` sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ....record import Record

__all__ = ["ClockFreeCheck", "StragglerCells", "StragglerChange", "StragglerHost", "StragglerInfo", "StragglerRank",
           "StragglerRuleInfo", "StragglerStep", "Stragglers"]


@dataclass
class StragglerRank(Record):
    """One rank: its lateness, extra work, blame and cost, and whether the rule names it (docs/report-format.md)."""

    rank: int
    host: str
    n_instances: int  # collectives it took part in
    n_steps: int
    lateness_ms: float  # its lateness in a step (the rule's), the median over its steps
    late_step_fraction: float  # share of its steps whose lateness reaches the floor
    late_fraction: float  # share of its collectives where it arrived last
    extra_work_ms: float | None  # its lateness with the ranks' waits for a CPU taken out, median over steps
    blame_ms: float  # how long the other ranks waited for it, each one's overlapping waits once
    blame_ms_per_step: float
    wait_ms_per_step: float  # how long it waited for the others (the same union)
    cost_ms_per_step: float  # per step its lead over the latest rank not named (severity follows it)
    clock_free_lateness_ms: float  # the lateness from durations alone (the cross-check), median over steps
    named: bool


@dataclass
class StragglerHost(Record):
    """One host: its latest rank's lateness against the other hosts, and whether the rule names it."""

    host: str
    ranks: list[int]
    blame_ms: float  # how long the other hosts' ranks waited for its ranks (each one's overlapping waits once)
    lateness_ms: float  # median over its steps
    late_fraction: float
    late_step_fraction: float
    named: bool


@dataclass
class StragglerStep(Record):
    """One recorded step: the latest rank, named the step's straggler (``rank``) when its lateness reaches the floor."""

    step: int
    rank: int | None
    lateness_ms: float
    blame_ms: float
    latest_rank: int


@dataclass
class StragglerChange(Record):
    """A step whose straggler differs from the previous step's."""

    step: int
    from_rank: int | None
    to_rank: int | None


@dataclass
class ClockFreeCheck(Record):
    """The clock-free cross-check (:mod:`.clock_free`)."""

    top_rank: int | None = None
    top_rank_by_lateness: int | None = None
    agrees: bool | None = None
    named_confirmed: dict[str, bool] = field(default_factory=dict)  # "<rank>" -> confirmed by durations


@dataclass
class StragglerRuleInfo(Record):
    """The naming rule as applied: its text, the floor and the parts it came from, and the rule's parameters."""

    text: str
    threshold_ms: float
    min_lateness_ms: float
    clock_residual_ms: float
    from_clock_residual_ms: float
    median_step_ms: float
    from_step_time_ms: float
    step_noise_ms: float
    from_noise_ms: float
    residual_factor: float
    step_fraction: float
    noise_factor: float
    max_noise_fraction: float
    min_late_fraction: float
    clock_free_factor: float


@dataclass
class StragglerCells(Record):
    """Per recorded (rank, step): the rank's lateness and extra work in the step (ms; None unknown), column-wise —
    what the HTML heatmap shows."""

    rank: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)
    lateness_ms: list[float] = field(default_factory=list)
    extra_work_ms: list[float | None] = field(default_factory=list)


@dataclass
class StragglerInfo(Record):
    """The report's ``straggler_info`` section: everything of the analysis but the rank rows."""

    rule: StragglerRuleInfo
    n_instances: int = 0
    named: list[int] = field(default_factory=list)  # ranks named, by cost
    hosts: list[StragglerHost] = field(default_factory=list)  # named first, then by blame
    per_step: list[StragglerStep] = field(default_factory=list)
    changes: list[StragglerChange] = field(default_factory=list)
    clock_free: ClockFreeCheck = field(default_factory=ClockFreeCheck)
    cells: StragglerCells = field(default_factory=StragglerCells)


@dataclass
class Stragglers:
    """The stragglers analysis: one row per rank (named first, then by cost) and the rest (:class:`StragglerInfo`)."""

    ranks: list[StragglerRank]
    info: StragglerInfo
    #: per rank, how long it waited for the named ranks per step (each overlapping wait once; empty: nobody named)
    waits_for_named: dict[int, float] = field(default_factory=dict)

    @property
    def named_rows(self) -> list[StragglerRank]:
        """The rows of the named ranks, by cost."""
        return [d for d in self.ranks if d.named]

    @property
    def threshold_ms(self) -> float:
        return self.info.rule.threshold_ms
