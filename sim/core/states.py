"""A request's lifecycle states (kept apart from :mod:`sim.core.request` so that module can be
compiled by mypyc, which does not compile enum classes' members as constants)."""
from enum import IntEnum


class State(IntEnum):
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED = 3
    REJECTED = 4
    UNFINISHED = 5
