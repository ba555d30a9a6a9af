"""``python -m bench.classes``: see the package's docstring."""

from bench import common
from bench.classes import main

common.run_main("classes", main)
