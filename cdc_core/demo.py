"""The demo: a local PostgreSQL with the shop data and some traffic, then the `orders` pipeline."""

from __future__ import annotations

import subprocess

from cdc_core.config import project_home
from cdc_core.launch import spark_submit, submit_environment
from cdc_core.pg.local import ensure_cluster
from cdc_core.sample.shop import create_schema, ensure_database, load_shop, table_counts
from cdc_core.sample.workload import WorkloadSpec, run_workload

DEMO_CLUSTER = "demo"


def run_demo(*, port: int = 5432, changes: int = 2000, lake: str = "./lake") -> int:
    """Start (or reuse) the demo server, load the shop once, write traffic, run the pipeline."""
    cluster = ensure_cluster(DEMO_CLUSTER, port=port, durable=True)
    ensure_database(cluster.dsn(), "shop")
    shop_dsn = cluster.dsn("shop")
    create_schema(shop_dsn)
    if table_counts(shop_dsn).customers == 0:
        print("loading the shop sample data ...", flush=True)
        load_shop(shop_dsn, customers=2000)
    if changes > 0:
        stats = run_workload(shop_dsn, WorkloadSpec(changes=changes, rate=None))
        print(f"workload: {stats.transactions_committed} transactions committed, "
              f"{stats.rows_changed_committed} row changes", flush=True)  # fmt: skip

    env = submit_environment({"ORDERS_PG_DSN": shop_dsn, "LAKE_ROOT": lake})
    home = project_home()
    command = [spark_submit(), str(home / "jobs" / "ingest.py"), "--pipeline", "orders"]
    print("$ " + " ".join(["spark-submit", "jobs/ingest.py", "--pipeline", "orders"]), flush=True)
    result = subprocess.run(command, env=env, cwd=home, check=False)

    counts = table_counts(shop_dsn)
    lake_root = (home / lake).resolve() / "orders" if "://" not in lake else f"{lake}/orders"
    print(
        "\n"
        f"PostgreSQL : {shop_dsn}  (data {cluster.data_dir}, log {cluster.log_file})\n"
        f"shop data  : {counts.customers} customers, {counts.orders} orders, "
        f"{counts.order_items} order items\n"
        f"lake       : {lake_root}\n"
        f"next       : export ORDERS_PG_DSN={shop_dsn}\n"
        f"             cdc doctor --pipeline orders\n"
        f"             spark-submit jobs/ingest.py --pipeline orders\n"
        f"stop it    : cdc pg stop   (remove it: cdc pg destroy)"
    )
    return result.returncode
