"""The checks behind ``python -m deploy.check``, one module per kind of file."""
