"""Running work: the Worker and its parts (fetching, slots, pools, locks, marker, stopping, signals) and the sweeper.

Imports the layers below it (protocol, producing, reading); the scheduler sits above it.
"""
