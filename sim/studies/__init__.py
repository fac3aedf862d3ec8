"""Studies: the simulations behind the committed ``results/`` and the files they write.

Each module runs batchsim on a designed set of scenarios and writes one report under
``results/`` (``python -m sim report`` runs them all, :mod:`sim.studies.regenerate`):
the static-vs-continuous speedup map (:mod:`~sim.studies.speedup_map`, its text and heat
maps beside it), client-side advice, MoE, speculative decoding, disaggregation and prefix
caching. What they print and plot comes from the pure functions of :mod:`sim.report`
(tables, figures, HTML, traces), which never simulate or write results themselves.
"""
