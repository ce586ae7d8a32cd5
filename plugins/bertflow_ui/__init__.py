"""The bertflow page's parts (plugins/bertflow_plugin.py registers them with Airflow):

- `routes`: the FastAPI app, its auth dependencies and one handler per page; each reads the
  artifact store through tasks.runs and renders a template.
- `templating`: the Jinja2 environment (autoescaped) and its filters.
- `charts`: the geometry of the SVG charts (axes, ticks, polylines, heat-map cells) as data;
  templates/charts.html draws it.
- `formatting`: numbers and durations as the pages print them.
- `templates/`: the pages, the chart macros and the stylesheet (Airflow's look).

Airflow imports every .py file under its plugins folder as a top-level module; plugins/
.airflowignore keeps it out of this package, which the entry file imports by name (Airflow
puts the plugins folder on the import path). Imports here are absolute for the same reason.
"""
