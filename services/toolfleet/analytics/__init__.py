"""Stream analytics on ``toolfleet.audit``: windowed tables per tenant and tool, anomaly
detectors, and the snapshot the API and Prometheus read.

Pure modules (:mod:`.facts`, :mod:`.windows`, :mod:`.stats`, :mod:`.detectors`,
:mod:`.engine`, :mod:`.snapshot`) hold every rule; :mod:`.app` is the faust-streaming
adapter that feeds them from the broker and keeps their tables in changelog topics.
"""
