"""The cluster metadata held in etcd, laid out as ZooKeeper-era Kafka held it in ZooKeeper.

A shared layer beneath the services: the key layout and its codec (:mod:`.keys`, pure),
the etcd address (:mod:`.endpoints`), the connection and its typed errors
(:mod:`.connection`), a process's lease (:mod:`.session`, the ZooKeeper session), a
broker's ephemeral registration (:mod:`.registration`) and the metadata a node is pushed
by the active controller (:mod:`.pushed`). The controller candidate that writes the keys
is the controller service's (``highwater.controller.etcd_controller``). docs/etcd-mode.md
is the design.
"""
