"""The Airflow side of bertflow (may import Airflow; `tasks/` may not): the controller operator
the DAGs use, and the local demo / `make airflow` supervisor (`python -m bertflow_airflow.demo`)."""
