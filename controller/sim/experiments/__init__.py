"""One command per research question: ``kvpool experiment q1|q2|q3|q4|fig9``.

Each module here exposes ``run(ctx) -> dict`` (the JSON result), ``table(result) -> str`` and
``plot(result, path)``; :mod:`controller.sim.experiments.cli` writes them to
``results/<question>/`` (table.txt, result.json, plot.png). ``--quick`` runs a reduced
version in well under a minute, which the test suite uses. The questions are documented,
with their measured answers, in docs/research/README.md.
"""
