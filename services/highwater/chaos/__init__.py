"""Jepsen-style fault tests: a real multi-process cluster, seeded faults, a history, a checker.

``python -m highwater.chaos run --seed N --duration S --faults kill,pause,partition,disk``
starts a cluster (:mod:`~highwater.chaos.cluster`), runs producers and group consumers
against it (:mod:`~highwater.chaos.workload`) while a seeded schedule
(:mod:`~highwater.chaos.schedule`) injects faults (:mod:`~highwater.chaos.faults`), records
every operation in a JSON-lines history (:mod:`~highwater.chaos.history`) and checks the
history against DESIGN.md §4 (:mod:`~highwater.chaos.checker`, pure). ``docs/chaos.md``
describes the whole.
"""
