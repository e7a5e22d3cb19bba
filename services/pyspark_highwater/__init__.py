"""Highwater's PySpark source and sink: ``spark.read.format("highwater")`` and friends.

Spark registers Python data sources from importable modules named ``pyspark_*`` that expose
``DefaultSource``, so installing Highwater is enough: ``format("highwater")`` needs no
``spark.dataSource.register`` call. See docs/spark.md for the options and guarantees.
"""

from pyspark_highwater.source import HighwaterDataSource

DefaultSource = HighwaterDataSource

__all__ = ["DefaultSource", "HighwaterDataSource"]
