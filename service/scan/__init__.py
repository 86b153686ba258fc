"""Corpus scans (`hallmark scan`): many texts against every key of a tenant or a store.

* :mod:`service.scan.corpus` -- the input and output files, resuming;
* :mod:`service.scan.verdicts` -- one item's text forms, detection and verdict record;
* :mod:`service.scan.gpu` -- a batch's scan statistics on the GPU;
* :mod:`service.scan.run` -- batches over CPU worker processes or the GPU.
"""
