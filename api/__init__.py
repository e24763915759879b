"""hydraplan's outer layer: the command line (`api.cli`), bundled sample data (`api.datasets`)
and the REST service (`api.service.app`, needs the `service` extra).

Importing this package imports nothing heavy: the CLI must start without FastAPI installed.
"""
