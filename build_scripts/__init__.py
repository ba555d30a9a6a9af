"""Build pipeline for ``torch-X.Y.Z+um`` wheels.

Start reading at :mod:`build_scripts.pipeline`: it follows one wheel from
``make build`` to ``dist/`` and names the module that does each step.
"""

from build_scripts.errors import BuildError

__all__ = ["BuildError"]
