"""The PySpark reconciliation job (`rig-conductor audit`): event log and Redis in, findings out.

`reconcile` holds the rules as pure DataFrame transforms; `sources` reads PostgreSQL (Spark JDBC)
and Redis; `report` draws the plots and the HTML page; `main` wires them to the command line.
Nothing here imports the API or the reaper, and importing this package does not import PySpark.
"""
