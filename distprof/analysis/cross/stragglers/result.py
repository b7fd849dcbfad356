"""What the stragglers analysis hands on (:func:`.find.find_stragglers`): a row per rank, a row per host, the
per-step straggler, and the rule with its floor — the report's ``stragglers`` and ``straggler_info`` sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ....record import Record, omit_if_none

__all__ = ["ClockFreeCheck", "StragglerChange", "StragglerHost", "StragglerInfo", "StragglerRank", "StragglerRuleInfo",
           "StragglerStep", "Stragglers"]


@dataclass
class StragglerRank(Record):
    """One rank's lateness, excess, own work, blame and cost, and whether the rule names it (docs/report-format.md)."""

    rank: int
    host: str
    n_instances: int
    n_steps: int
    blame_ms: float
    blame_ms_per_step: float
    mean_lateness_ms: float
    cpu_wait_excess_ms: float
    lateness_not_cpu_wait_ms: float
    cpu_time_ratio: float | None
    page_faults_per_step: float | None
    others_page_faults_per_step: float | None
    mean_excess_ms: float
    own_excess_ms: float | None
    own_excess_median_ms: float | None
    own_excess_bound_ms: float | None
    own_positive_fraction: float | None
    own_sign_p: float
    own_steps_consistent: bool
    excess_bound_ms: float | None
    excess_step_fraction: float
    outlier_step_fraction: float
    mean_instance_lateness_ms: float
    max_behind_first_ms: float
    late_fraction: float
    late_step_fraction: float
    lost_ms_per_step: float
    cost_ms_per_step: float
    clock_free_lateness_ms: float
    clock_free_wait_ms: float
    named: bool


@dataclass
class StragglerHost(Record):
    """One host: its latest rank's lateness against the other hosts, and whether the rule names it."""

    host: str
    ranks: list[int]
    blame_ms: float
    mean_lateness_ms: float
    mean_excess_ms: float
    excess_bound_ms: float | None
    late_fraction: float
    late_step_fraction: float
    named: bool


@dataclass
class StragglerStep(Record):
    """One recorded step: the rank most in excess (``rank`` None when its excess is under the floor)."""

    step: int
    rank: int | None
    lateness_ms: float
    excess_ms: float
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
    arrival_jitter_ms: float
    from_jitter_ms: float
    residual_factor: float
    step_fraction: float
    min_late_fraction: float
    confidence: float
    single_step_factor: float
    jitter_factor: float
    clock_free_factor: float
    outlier_z: float
    step_noise_ms: float | None = omit_if_none()  # the run's step-to-step noise (absent without instances)


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


@dataclass
class Stragglers:
    """The stragglers analysis: one row per rank (named first, then by cost) and the rest (:class:`StragglerInfo`)."""

    ranks: list[StragglerRank]
    info: StragglerInfo

    @property
    def named_rows(self) -> list[StragglerRank]:
        """The rows of the named ranks, by cost."""
        return [d for d in self.ranks if d.named]

    @property
    def threshold_ms(self) -> float:
        return self.info.rule.threshold_ms
