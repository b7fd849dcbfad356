"""The step graph's vocabulary (:mod:`.critical_path`): how a work segment hangs off what precedes it, and the kinds
of sync events."""

__all__ = ["LINK_START", "LINK_ARRIVAL", "LINK_END", "KIND_COLL", "KIND_SEND", "KIND_RECV"]

#: How a segment hangs off what precedes it: the rank-step's start, the previous event's arrival, its end.
LINK_START, LINK_ARRIVAL, LINK_END = 0, 1, 2
#: Event kinds: a collective's member, a send, a receive.
KIND_COLL, KIND_SEND, KIND_RECV = 0, 1, 2
