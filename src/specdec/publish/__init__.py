"""The publishing pipeline: ``specdec results`` regenerates docs/RESULTS.md, ``specdec plot`` draws figures.

It runs the measuring commands (:mod:`specdec.bench`, :mod:`specdec.alpha`) and turns their documents
into a report; nothing here is needed to generate text or to measure.

- :mod:`~specdec.publish.results`: ``specdec results``, the RESULTS.md writer;
- :mod:`~specdec.publish.plan`: its steps, each with the equivalent ``specdec alpha`` / ``bench`` command;
- :mod:`~specdec.publish.plots`: the paper's figures and speedup-vs-gamma plots (``specdec plot``);
- :mod:`~specdec.publish.beam_bench`: the speculative beam search benchmark of the results.
"""
