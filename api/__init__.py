"""hydraplan's outer layer: two front doors over the planner and the libraries they share.

- `cli/`: the `hydraplan` command line, one module per command (`python -m hydraplan.api.cli`).
- `service/`: the REST service behind `hydraplan serve` (needs the `service` extra), with its
  routes and the web page.
- `whatif/`: the what-if sweep engine behind `hydraplan whatif` and the service's sweep jobs.
- `render/`: timelines of plans, as data and drawn (SVG, HTML, PNG).
- `datasets/`: the bundled sample datasets and length files.
- `files.py`: the readers of the files users hand hydraplan (plans, profiles, catalogs, text).
- `client.py`: Python clients of the REST service (`hydraplan.Client`, `hydraplan.AsyncClient`).

Imports flow one way (tests/test_import_graph.py): the command line and the service import the
libraries, the libraries import neither front door, the service never imports the command line,
and the command line imports the service only inside `hydraplan serve`. Importing this package
imports nothing: the CLI must start without FastAPI installed.
"""
