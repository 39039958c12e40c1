"""PostgreSQL change data capture into Delta Lake on Spark."""

__version__ = "0.1.0"
