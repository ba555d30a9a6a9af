"""One-question probes: each measures one thing that a step of the lab notes asked
(docs/notes/), on a GPU host. ``python -m bench`` lists them; ``python -m bench NAME`` or
``python -m bench.probes.NAME`` runs one. The C++ and CUDA probes say in their first lines
how to build them."""
