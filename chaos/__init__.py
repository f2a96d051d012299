"""Jepsen-style fault tests for Jetraft: real node processes, faults, a history of what
clients saw, and a checker comparing it with what every replica finally holds.

Modules: `history` (the event log), `checker` (pure: history + final states -> verdict),
`nodes` (process control), `net` (partitions through network namespaces), `workload`
(nats-py publishers and consumers), `faults` (the nemesis), `state` (final states, online
through nats-py and offline from each node's LMDB), `run` (one test run), `cli`.
"""
